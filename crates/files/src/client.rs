//! A client of one server: the contact connection, its fabric node, and
//! the requests `cp`, `ls`, `stat`, `rm` and `mkdir` are made of.

use macrolink_fabric::{Addr, Node, NodeConfig, Transport};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::auth::{self, Secret};
use crate::data::{self, gather, join, DataError, Receiver, Sender, Sink, Source};
use crate::error::{Error, Result};
use crate::lane;
use crate::proto::{self, FabricInfo, Landing, Meta, Reply, Request, Shape};
use crate::server::{host_id, random_node_id};
use crate::sums::Digest;
use crate::wire_io::{self, ReadError};

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Directory where fabric nodes of this host meet.
    pub shm_dir: PathBuf,
    /// Never use shared memory, even on the server's host.
    pub no_shm: bool,
    /// Servers, by contact address, whose data goes through I/O gateways.
    pub lanes: HashMap<SocketAddr, lane::Route>,
    /// Contact addresses of servers by host name (from a cluster file):
    /// `ml://store0/...` reaches the one named `store0`.
    pub hosts: HashMap<String, SocketAddr>,
    /// Hosts the cluster's central manager has excluded: their gateways
    /// carry nothing.
    pub excluded: Option<macrolink_manage::excluded::Excluded>,
    /// Servers, by contact address, on the far side of a relay pair: the
    /// storage host's node, and the port of this host's relay that stands
    /// for it. Their contact goes through the relays, their data through
    /// the gateways of their lane.
    pub relayed: HashMap<SocketAddr, (u32, SocketAddr)>,
    /// Servers, by contact address, in a segment of the cluster file, when
    /// this host did not say which host of the file it is: what to tell a
    /// user who cannot reach one.
    pub segment_hints: HashMap<SocketAddr, String>,
    /// UCX on this side's node: file data to a server that speaks it too,
    /// and to the gateways of a lane, goes over it.
    pub ucx: Option<macrolink_fabric::UcxOptions>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            shm_dir: macrolink_fabric::default_shm_dir(),
            no_shm: false,
            lanes: HashMap::new(),
            hosts: HashMap::new(),
            excluded: None,
            relayed: HashMap::new(),
            segment_hints: HashMap::new(),
            ucx: None,
        }
    }
}

/// How long the phases of one transfer took, as the parallel I/O
/// benchmark counts them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Moved {
    /// Bytes moved.
    pub bytes: u64,
    /// From the request to the server's go (create and open there).
    pub open: Duration,
    /// The data.
    pub transfer: Duration,
    /// From the last byte to the server's final word (verify, sync,
    /// rename: the close).
    pub close: Duration,
    /// Through gateways: what went through each.
    pub carried: Option<lane::Carried>,
}

/// A connection to a server.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    node: Node,
    server: FabricInfo,
    transport: Transport,
    next_ep: AtomicU32,
    lane: Option<lane::Route>,
    /// Reached through a relay pair: the storage host's name for errors.
    relayed: Option<String>,
    /// Uploads ask the server to write past its page cache.
    direct: bool,
}

fn connection(context: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Connection {
        context: context.to_string(),
        source,
    }
}

fn read_error(e: ReadError) -> Error {
    match e {
        ReadError::Io(source) => Error::Connection {
            context: "reading a reply".into(),
            source,
        },
        ReadError::Proto(p) => Error::Proto(p),
    }
}

impl Client {
    /// Connects to `addr` (host:port) and authenticates with `secret`.
    pub fn connect(addr: &str, secret: &Secret, opts: &ClientOptions) -> Result<Client> {
        let mut ctx = format!("connecting to {addr}");
        let name = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let sock: SocketAddr = match opts.hosts.get(name) {
            Some(a) => *a,
            None => addr
                .to_socket_addrs()
                .map_err(connection(&ctx))?
                .next()
                .ok_or_else(|| Error::Usage(format!("{addr}: no address")))?,
        };
        if let Some(hint) = opts.segment_hints.get(&sock) {
            ctx = format!("{ctx} ({hint})");
        }
        let via = opts.relayed.get(&sock).copied();
        let mut stream = TcpStream::connect_timeout(&via.map_or(sock, |v| v.1), CONNECT_TIMEOUT)
            .map_err(connection(&ctx))?;
        stream.set_nodelay(true).map_err(connection(&ctx))?;
        if let Some((node, relay)) = via {
            let through = format!("{ctx} through the relay at {relay}");
            contact_through_relay(&mut stream, secret, node)
                .map_err(|e| connection(&through)(e.into()))?;
        }
        let Reply::Challenge { version, nonce } = recv_reply(&mut stream)? else {
            return Err(Error::Unexpected("expected a challenge".into()));
        };
        if version != proto::VERSION {
            return Err(Error::Version(version, proto::VERSION));
        }
        let local = stream.local_addr().map_err(connection(&ctx))?;
        let mut cfg = NodeConfig::local(random_node_id().map_err(connection(&ctx))?, &opts.shm_dir);
        cfg.tcp = Some(SocketAddr::new(local.ip(), 0));
        cfg.udp = None;
        cfg.key = Some(secret.fabric_key());
        cfg.ucx = opts.ucx.clone();
        let lane = opts.lanes.get(&sock).cloned();
        for (gw, addr) in lane.iter().flat_map(|l| &l.gateways) {
            cfg.peers.insert(gw.node, *addr);
        }
        let node = Node::start(cfg)?;
        let me = FabricInfo {
            node: node.id(),
            host: host_id(),
            shm_dir: opts.shm_dir.display().to_string(),
            tcp: SocketAddr::new(local.ip(), node.tcp_addr().map_or(0, |a| a.port())).to_string(),
            shm: !opts.no_shm,
            ucx: opts.ucx.is_some(),
        };
        let my_nonce = auth::nonce().map_err(connection(&ctx))?;
        wire_io::send(
            &mut stream,
            &Request::Auth {
                version: proto::VERSION,
                proof: secret.client_proof(&nonce),
                nonce: my_nonce,
                fabric: me.clone(),
            },
        )
        .map_err(connection(&ctx))?;
        let Reply::Welcome { proof, fabric } = recv_reply(&mut stream)? else {
            return Err(Error::Unexpected("expected a welcome".into()));
        };
        if !auth::proof_matches(&secret.server_proof(&my_nonce), &proof) {
            return Err(Error::ServerNotAuthentic);
        }
        if let Ok(a) = fabric.tcp.parse() {
            node.add_peer(fabric.node, a);
        }
        let transport = me.transport_to(&fabric);
        Ok(Client {
            stream,
            node,
            server: fabric,
            transport,
            next_ep: AtomicU32::new(1),
            lane,
            relayed: via.map(|_| name.to_string()),
            direct: false,
        })
    }

    /// Uploads from now on ask the server to write the file past its page
    /// cache (`O_DIRECT`, see [`crate::direct`]), where its file system
    /// does direct I/O.
    pub fn set_direct(&mut self, on: bool) {
        self.direct = on;
    }

    /// Refuses file data that would have to go straight across a relay
    /// pair: it goes through a lane's gateways, which reach the client over
    /// the connections it made.
    fn direct_allowed(&self) -> Result<()> {
        match &self.relayed {
            Some(name) if self.lane.is_none() => Err(Error::Usage(format!(
                "{name} is across the relay pair: file data to it goes through the \
                 gateways of its lane, and the cluster file gives it none \
                 (add a [[lane]] with gateways in its segment)"
            ))),
            _ => Ok(()),
        }
    }

    /// The server's fabric node, as it named it.
    pub fn server_fabric(&self) -> &FabricInfo {
        &self.server
    }

    /// The transport file data takes.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The gateways file data goes through, if any.
    pub fn lane(&self) -> Option<&lane::Route> {
        self.lane.as_ref()
    }

    /// The gateways of the lane in use now (none excluded), and the
    /// request that names them to the server.
    fn lane_request(&self, ep: u32, key: u64) -> (Vec<Addr>, Option<proto::Lane>) {
        let gws = self
            .lane
            .as_ref()
            .map(lane::Route::live)
            .unwrap_or_default();
        let req = self.lane.as_ref().map(|_| proto::Lane {
            gateways: gws.iter().map(|g| (g.node, g.ep)).collect(),
            ep,
            key,
        });
        (gws, req)
    }

    fn call(&mut self, req: &Request) -> Result<Reply> {
        wire_io::send(&mut self.stream, req).map_err(connection("sending a request"))?;
        recv_reply(&mut self.stream)
    }

    /// Metadata of `path`.
    pub fn stat(&mut self, path: &str) -> Result<Meta> {
        match self.call(&Request::Stat { path: path.into() })? {
            Reply::Meta(m) => Ok(m),
            r => Err(unexpected(r)),
        }
    }

    /// Entries of directory `path`.
    pub fn list(&mut self, path: &str) -> Result<Vec<Meta>> {
        match self.call(&Request::List { path: path.into() })? {
            Reply::Entries(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    /// Makes directory `path`.
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<()> {
        self.ok(&Request::Mkdir {
            path: path.into(),
            parents,
        })
    }

    /// Removes `path`.
    pub fn remove(&mut self, path: &str, recursive: bool) -> Result<()> {
        self.ok(&Request::Remove {
            path: path.into(),
            recursive,
        })
    }

    /// Size and chunk digests of `path` (or of its partial upload).
    pub fn sums(&mut self, path: &str, chunk: u32, partial: bool) -> Result<(u64, Vec<Digest>)> {
        match self.call(&Request::Sums {
            path: path.into(),
            chunk,
            partial,
        })? {
            Reply::Sums { size, digests } => Ok((size, digests)),
            r => Err(unexpected(r)),
        }
    }

    fn ok(&mut self, req: &Request) -> Result<()> {
        match self.call(req)? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    fn ep_id(&self) -> u32 {
        self.next_ep.fetch_add(1, Ordering::Relaxed)
    }

    /// Reads `shape.len` bytes (cut to the end of the file) of `path` from
    /// `shape.offset` into `sink` over `streams` streams. `opened` learns the
    /// file's size and the bytes to come before any arrive. Returns the bytes
    /// received, verified against the server's digest, and the phases' times.
    pub fn get(
        &mut self,
        path: &str,
        shape: Shape,
        streams: u32,
        sink: &dyn Sink,
        shared: &data::Shared,
        opened: &mut dyn FnMut(u64, u64) -> Result<()>,
    ) -> Result<Moved> {
        if self.lane.is_some() {
            return self.get_through(path, shape, sink, shared, opened);
        }
        self.direct_allowed()?;
        let t0 = Instant::now();
        let mut receivers = Vec::new();
        for _ in 0..streams.max(1) {
            receivers.push(Receiver::open(
                &self.node,
                self.ep_id(),
                self.server.node,
                &shape,
            )?);
        }
        let n = receivers.len() as u32;
        let (size, len) = match self.call(&Request::Get {
            path: path.into(),
            shape,
            streams: receivers.iter().map(Receiver::end).collect(),
            verify: !shared.no_digests,
            lane: None,
        })? {
            Reply::Sending { size, len, .. } => (size, len),
            r => return Err(unexpected(r)),
        };
        let shape = Shape { len, ..shape };
        let t1 = Instant::now();
        if let Err(e) = opened(size, len) {
            shared.abort.store(true, Ordering::Relaxed);
            drop(receivers);
            let _ = recv_reply(&mut self.stream);
            return Err(e);
        }
        let results = thread::scope(|scope| {
            let handles: Vec<_> = receivers
                .into_iter()
                .enumerate()
                .map(|(s, r)| {
                    let shape = &shape;
                    scope.spawn(move || r.run(shape, s as u32, n, sink, shared))
                })
                .collect();
            handles.into_iter().map(join).collect::<Vec<_>>()
        });
        let t2 = Instant::now();
        let reply = recv_reply(&mut self.stream);
        check_sent(path, &shape, reply, results)?;
        Ok(Moved {
            bytes: len,
            open: t1 - t0,
            transfer: t2 - t1,
            close: t2.elapsed(),
            carried: None,
        })
    }

    /// [`get`](Self::get) through the gateways of the lane.
    fn get_through(
        &mut self,
        path: &str,
        shape: Shape,
        sink: &dyn Sink,
        shared: &data::Shared,
        opened: &mut dyn FnMut(u64, u64) -> Result<()>,
    ) -> Result<Moved> {
        let t0 = Instant::now();
        let mut ep = self.node.open(self.ep_id(), lane::endpoint_config())?;
        let key = crate::auth::random_key().map_err(connection("making a transfer key"))?;
        let (gws, lane) = self.lane_request(ep.addr().ep, key);
        let (size, len, from) = match self.call(&Request::Get {
            path: path.into(),
            shape,
            streams: Vec::new(),
            verify: !shared.no_digests,
            lane,
        })? {
            Reply::Sending { size, len, ep } => (size, len, ep),
            r => return Err(unexpected(r)),
        };
        let shape = Shape { len, ..shape };
        let t1 = Instant::now();
        // Refused here: the server sends anyway; take it into nothing, so
        // that the connection stays in step.
        let refused = opened(size, len).err();
        let sink: &dyn Sink = if refused.is_some() {
            &data::Discard
        } else {
            sink
        };
        let far = lane::Far {
            gateways: &gws,
            peer: Addr::new(self.server.node, from),
            key,
        };
        let done = AtomicBool::new(false);
        let (received, reply) = thread::scope(|scope| {
            let (shape, done) = (&shape, &done);
            let h =
                scope.spawn(move || lane::receive(&mut ep, far, shape, sink, shared, done, true));
            let reply = recv_reply(&mut self.stream);
            done.store(true, Ordering::Relaxed);
            (join(h), reply)
        });
        let t2 = Instant::now();
        if let Some(e) = refused {
            return Err(e);
        }
        let (digests, carried) = match received {
            Ok((d, c)) => (Ok(d), Some(c)),
            Err(e) => (Err(e), None),
        };
        check_sent(path, &shape, reply, vec![digests])?;
        Ok(Moved {
            bytes: len,
            open: t1 - t0,
            transfer: t2 - t1,
            close: t2.elapsed(),
            carried,
        })
    }

    /// Writes `shape.len` bytes of `source` from `shape.offset` to `path`
    /// over `streams` streams, landing as `landing`; `size` is the whole
    /// file's. Returns once the server has verified (and, with `sync`, made
    /// durable) what it received.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &mut self,
        path: &str,
        size: u64,
        shape: Shape,
        streams: u32,
        sync: bool,
        landing: Landing,
        source: &dyn Source,
        shared: &data::Shared,
    ) -> Result<Moved> {
        self.direct_allowed()?;
        let t0 = Instant::now();
        let mut lane_ep = match self.lane {
            Some(_) => Some(self.node.open(self.ep_id(), lane::endpoint_config())?),
            None => None,
        };
        let n = if lane_ep.is_some() { 1 } else { streams.max(1) };
        let (gws, lane) = match &lane_ep {
            Some(ep) => self.lane_request(ep.addr().ep, 0),
            None => (Vec::new(), None),
        };
        let ends = match self.call(&Request::Put {
            path: path.into(),
            size,
            shape,
            streams: n,
            sync,
            landing,
            verify: !shared.no_digests,
            lane,
            direct: self.direct,
        })? {
            Reply::Receiving { streams } if streams.len() == n as usize => streams,
            r => return Err(unexpected(r)),
        };
        let t1 = Instant::now();
        let (peer, transport) = (self.server.node, self.transport);
        let mut carried = None;
        let results = if let (Some(ep), Some(route)) = (lane_ep.as_mut(), &self.lane) {
            let far = lane::Far {
                gateways: &gws,
                peer: Addr::new(peer, ends[0].ep),
                key: ends[0].key,
            };
            let sent = lane::send(ep, far, &shape, source, shared, route.send.clone());
            vec![sent.map(|(d, c)| {
                carried = Some(c);
                d
            })]
        } else {
            thread::scope(|scope| {
                let handles: Vec<_> = ends
                    .iter()
                    .enumerate()
                    .map(|(s, end)| {
                        let (node, id, shape) = (&self.node, self.ep_id(), &shape);
                        scope.spawn(move || {
                            Sender::open(node, id, peer, *end, transport)
                                .map_err(DataError::from)?
                                .run(shape, s as u32, n, source, shared)
                        })
                    })
                    .collect();
                handles.into_iter().map(join).collect::<Vec<_>>()
            })
        };
        let t2 = Instant::now();
        let ours = gather(&shape, results);
        let digest = match &ours {
            Ok(d) => *d,
            Err(_) => [0; 16],
        };
        let reply = self.call(&Request::Commit {
            bytes: shape.len,
            digest,
        });
        // The server's word explains a failure best (a full disk there
        // breaks the streams here).
        match (reply, ours) {
            (Ok(Reply::Ok), Ok(_)) => Ok(Moved {
                bytes: shape.len,
                open: t1 - t0,
                transfer: t2 - t1,
                close: t2.elapsed(),
                carried,
            }),
            (Err(e @ Error::Remote { .. }), _) => Err(e),
            (_, Err(f)) => Err(Error::Remote {
                code: f.code,
                message: f.message,
            }),
            (Ok(r), Ok(_)) => Err(unexpected(r)),
            (Err(e), Ok(_)) => Err(e),
        }
    }
}

/// Checks a `Get`'s last reply against the digests of what arrived.
fn check_sent(
    path: &str,
    shape: &Shape,
    reply: Result<Reply>,
    results: Vec<std::result::Result<Vec<(u64, Digest)>, DataError>>,
) -> Result<()> {
    let ours = gather(shape, results);
    let (bytes, theirs) = match reply? {
        Reply::Sent { bytes, digest } => (bytes, digest),
        r => return Err(unexpected(r)),
    };
    let ours = ours.map_err(|f| Error::Remote {
        code: f.code,
        message: f.message,
    })?;
    if ours != theirs || bytes != shape.len {
        return Err(Error::Mismatch(path.into()));
    }
    Ok(())
}

fn recv_reply(stream: &mut TcpStream) -> Result<Reply> {
    match wire_io::recv::<Reply>(stream, proto::MAX_REPLY).map_err(read_error)? {
        Reply::Error { code, message } => Err(Error::Remote { code, message }),
        r => Ok(r),
    }
}

fn unexpected(r: Reply) -> Error {
    Error::Unexpected(format!("{r:?}"))
}

/// Asks the relay at the other end of `stream` for the file service of
/// storage node `node`, proving the cluster key to the relay; from then on
/// the stream reaches the file service.
fn contact_through_relay(
    stream: &mut TcpStream,
    secret: &Secret,
    node: u32,
) -> std::result::Result<(), macrolink_fabric::Error> {
    let mut h = macrolink_wire::Header::new(macrolink_wire::FrameKind::Hello);
    h.flags = macrolink_wire::Flags::CONTACT;
    h.dst_ep = node;
    macrolink_fabric::handshake(stream, &secret.fabric_key(), h).map(|_| ())
}
