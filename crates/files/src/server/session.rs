//! One authenticated client connection: requests in, replies out, and the
//! data streams of its transfers.

use macrolink_fabric::{Addr, Endpoint, Transport};
use macrolink_gwnet::client::SendConfig;
use std::io;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use super::{OpenFile, Shared};
use crate::data::{self, gather, join, DataError, Receiver, Sender};
use crate::lane::{self, Far};
use crate::ops::{Failure, OpResult};
use crate::proto::{self, Code, FabricInfo, Landing, Lane, Reply, Request, Shape, StreamEnd};
use crate::sums::{self, Digest};
use crate::uncached::Writes;
use crate::wire_io::{self, ReadError};

/// A session.
#[derive(Debug)]
pub(super) struct Session {
    shared: Arc<Shared>,
    stream: TcpStream,
    ip: IpAddr,
    client: FabricInfo,
    transport: Transport,
}

/// How a session ends.
#[derive(Debug, thiserror::Error)]
pub(super) enum End {
    #[error("{0}")]
    Read(#[from] ReadError),
    #[error("writing a reply: {0}")]
    Write(#[from] io::Error),
}

impl Session {
    pub(super) fn new(
        shared: Arc<Shared>,
        stream: TcpStream,
        ip: IpAddr,
        client: FabricInfo,
    ) -> Session {
        let mine = FabricInfo {
            node: shared.node.id(),
            host: shared.host.clone(),
            shm_dir: shared.shm_dir.display().to_string(),
            tcp: String::new(),
            shm: true,
            ucx: shared.ucx,
        };
        let transport = mine.transport_to(&client);
        Session {
            shared,
            stream,
            ip,
            client,
            transport,
        }
    }

    fn reply(&mut self, r: Reply) -> io::Result<()> {
        match &r {
            Reply::Sent { bytes, .. } => self.shared.meter.moved("get", *bytes),
            Reply::Error { code, .. } => self.shared.meter.error(*code),
            _ => {}
        }
        wire_io::send(&mut self.stream, &r)
    }

    fn answer<T>(&mut self, r: OpResult<T>, ok: impl FnOnce(T) -> Reply) -> io::Result<()> {
        let msg = match r {
            Ok(v) => ok(v),
            Err(f) => failure(f),
        };
        self.reply(msg)
    }

    /// Serves requests until the client leaves. A request that does not
    /// decode is answered with an error and ends the connection, whose
    /// framing can no longer be trusted.
    pub(super) fn run(mut self) -> Result<(), End> {
        loop {
            let req = match wire_io::recv::<Request>(&mut self.stream, proto::MAX_REQUEST) {
                Ok(r) => r,
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(ReadError::Proto(e)) => {
                    let _ = self.reply(failure(Failure::new(Code::BadRequest, e.to_string())));
                    return Err(End::Read(ReadError::Proto(e)));
                }
                Err(e) => return Err(e.into()),
            };
            self.handle(req)?;
        }
    }

    fn handle(&mut self, req: Request) -> Result<(), End> {
        let x = &self.shared.export;
        match req {
            Request::Stat { path } => {
                let r = x.stat(&path);
                self.answer(r, Reply::Meta)?
            }
            Request::List { path } => {
                let r = x.list(&path);
                self.answer(r, Reply::Entries)?
            }
            Request::Mkdir { path, parents } => {
                let r = x.mkdir(&path, parents);
                self.answer(r, |()| Reply::Ok)?
            }
            Request::Remove { path, recursive } => {
                let r = x.remove(&path, recursive);
                self.answer(r, |()| Reply::Ok)?
            }
            Request::Sums {
                path,
                chunk,
                partial,
            } => {
                let r = self.sums(&path, chunk, partial);
                self.answer(r, |(size, digests)| Reply::Sums { size, digests })?
            }
            Request::Get {
                path,
                shape,
                streams,
                verify,
                lane,
            } => self.get(&path, shape, &streams, verify, lane)?,
            Request::Put {
                path,
                size,
                shape,
                streams,
                sync,
                landing,
                verify,
                lane,
                direct,
            } => self.put(
                &path, size, shape, streams, sync, landing, verify, lane, direct,
            )?,
            Request::Auth { .. } | Request::Commit { .. } => self.reply(failure(Failure::new(
                Code::BadRequest,
                "request out of turn",
            )))?,
        }
        Ok(())
    }

    fn sums(&self, path: &str, chunk: u32, partial: bool) -> OpResult<(u64, Vec<Digest>)> {
        if !(4096..=64 << 20).contains(&chunk) {
            return Err(Failure::new(Code::BadRequest, "chunk size out of range"));
        }
        let _open = self.shared.open_file(self.ip)?;
        let f = if partial {
            self.shared.export.open_partial_read(path)?
        } else {
            self.shared.export.open_read(path)?
        };
        sums::file_chunks(&f, chunk).map_err(|e| Failure::io(path, &e))
    }

    fn open_counted(&self) -> OpResult<OpenFile> {
        self.shared.open_file(self.ip)
    }

    /// Sends bytes of a file to the client's regions.
    fn get(
        &mut self,
        path: &str,
        shape: Shape,
        ends: &[StreamEnd],
        verify: bool,
        lane: Option<Lane>,
    ) -> Result<(), End> {
        let opened = (|| {
            let streams = if lane.is_some() { 1 } else { ends.len() };
            shape
                .check(streams as u32)
                .map_err(|m| Failure::new(Code::BadRequest, m))?;
            if let Some(l) = &lane {
                check_lane(l)?;
            }
            let guard = self.open_counted()?;
            let file = self.shared.export.open_read(path)?;
            let size = file.metadata().map_err(|e| Failure::io(path, &e))?.len();
            if shape.offset > size {
                return Err(Failure::new(
                    Code::BadRequest,
                    format!("{path}: offset {} past the end ({size})", shape.offset),
                ));
            }
            let len = shape.len.min(size - shape.offset);
            Ok((guard, file, size, Shape { len, ..shape }))
        })();
        let (_guard, file, size, shape) = match opened {
            Ok(x) => x,
            Err(f) => return Ok(self.reply(failure(f))?),
        };
        if let Some(lane) = lane {
            return self.get_through(lane, &file, size, &shape, verify);
        }
        self.reply(Reply::Sending {
            size,
            len: shape.len,
            ep: 0,
        })?;
        let shared = data::Shared::default().skipping_digests(!verify);
        let n = ends.len() as u32;
        let results: Vec<Result<Vec<(u64, Digest)>, DataError>> = thread::scope(|scope| {
            let handles: Vec<_> = ends
                .iter()
                .enumerate()
                .map(|(s, end)| {
                    let (file, shared, shape) = (&file, &shared, &shape);
                    let (node, id) = (&self.shared.node, self.shared.ep_id());
                    let (peer, transport) = (self.client.node, self.transport);
                    scope.spawn(move || {
                        Sender::open(node, id, peer, *end, transport)
                            .map_err(DataError::from)?
                            .run(shape, s as u32, n, file, shared)
                    })
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        let msg = match gather(&shape, results) {
            Ok(digest) => Reply::Sent {
                bytes: shape.len,
                digest,
            },
            Err(f) => failure(f),
        };
        Ok(self.reply(msg)?)
    }

    /// Sends bytes of a file through the gateways of `lane`.
    fn get_through(
        &mut self,
        lane: Lane,
        file: &std::fs::File,
        size: u64,
        shape: &Shape,
        verify: bool,
    ) -> Result<(), End> {
        let mut ep = match self.open_lane_endpoint() {
            Ok(ep) => ep,
            Err(f) => return Ok(self.reply(failure(f))?),
        };
        self.reply(Reply::Sending {
            size,
            len: shape.len,
            ep: ep.addr().ep,
        })?;
        let gws = lane_gateways(&lane);
        let msg = if lane::await_hellos(&mut ep, &gws, lane::HELLO_WAIT) == 0 {
            failure(Failure::new(
                Code::Lost,
                "no gateway of the lane reached the server",
            ))
        } else {
            let shared = data::Shared::default().skipping_digests(!verify);
            let far = Far {
                gateways: &gws,
                peer: Addr::new(self.client.node, lane.ep),
                key: lane.key,
            };
            let cfg = SendConfig {
                excluded: self.shared.excluded.clone(),
                heard: Some(self.shared.heard.clone()),
                ..SendConfig::default()
            };
            let sent = lane::send(&mut ep, far, shape, file, &shared, cfg);
            if let Ok((_, c)) = &sent {
                self.shared.meter.carried(c);
            }
            match gather(shape, vec![sent.map(|(d, _)| d)]) {
                Ok(digest) => Reply::Sent {
                    bytes: shape.len,
                    digest,
                },
                Err(f) => failure(f),
            }
        };
        Ok(self.reply(msg)?)
    }

    fn open_lane_endpoint(&self) -> OpResult<Endpoint> {
        self.shared
            .node
            .open(self.shared.ep_id(), lane::endpoint_config())
            .map_err(|e| Failure::new(Code::Io, format!("data endpoint: {e}")))
    }

    /// Receives bytes of a file from the client into the partial file (or
    /// in place), and renames it over the final name once the client has
    /// committed and the digest matches.
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        path: &str,
        size: u64,
        shape: Shape,
        streams: u32,
        sync: bool,
        landing: Landing,
        verify: bool,
        lane: Option<Lane>,
        direct: bool,
    ) -> Result<(), End> {
        let keep_partial = matches!(landing, Landing::Replace { keep_partial: true });
        let opened = (|| {
            shape
                .check(streams)
                .map_err(|m| Failure::new(Code::BadRequest, m))?;
            if let Some(l) = &lane {
                check_lane(l)?;
            }
            if matches!(landing, Landing::Replace { .. }) && shape.offset + shape.len != size {
                return Err(Failure::new(
                    Code::BadRequest,
                    "range does not end at the size",
                ));
            }
            let guard = self.open_counted()?;
            let x = &self.shared.export;
            x.writable(path)?;
            let ends = match &lane {
                Some(_) => {
                    let key = crate::auth::random_key()
                        .map_err(|e| Failure::new(Code::Io, e.to_string()))?;
                    Ends::Lane(Box::new(self.open_lane_endpoint()?), key)
                }
                None => {
                    let mut receivers = Vec::new();
                    for _ in 0..streams {
                        let r = Receiver::open(
                            &self.shared.node,
                            self.shared.ep_id(),
                            self.client.node,
                            &shape,
                        )
                        .map_err(|e| Failure::new(Code::Io, format!("data endpoint: {e}")))?;
                        receivers.push(r);
                    }
                    Ends::Streams(receivers)
                }
            };
            // Last, so that a refusal never touches a partial file that
            // another upload, or a later resume, owns.
            let file = match landing {
                Landing::Replace { .. } => x.open_partial(path, shape.offset > 0)?,
                Landing::InPlace => x.open_in_place(path)?,
            };
            Ok((guard, file, ends))
        })();
        let (_guard, file, ends) = match opened {
            Ok(x) => x,
            Err(f) => return Ok(self.reply(failure(f))?),
        };
        self.reply(Reply::Receiving {
            streams: match &ends {
                Ends::Streams(r) => r.iter().map(Receiver::end).collect(),
                Ends::Lane(ep, key) => vec![StreamEnd {
                    ep: ep.addr().ep,
                    key: *key,
                }],
            },
        })?;
        // Past the page cache when asked and possible, else uncached past
        // its head unless the server keeps every page.
        let writes = Writes::choose(&file, direct, self.shared.cache, false, &path);
        let sink = writes.sink();
        let shared = data::Shared::default().skipping_digests(!verify);
        let done = AtomicBool::new(false);
        let client = self.client.node;
        let (results, commit) = thread::scope(|scope| {
            let (shared, shape, done) = (&shared, &shape, &done);
            let handles: Vec<_> = match ends {
                Ends::Streams(receivers) => receivers
                    .into_iter()
                    .enumerate()
                    .map(|(s, r)| {
                        scope.spawn(move || r.run(shape, s as u32, streams, sink, shared))
                    })
                    .collect(),
                Ends::Lane(mut ep, key) => {
                    let peer = Addr::new(client, lane.as_ref().map_or(0, |l| l.ep));
                    vec![scope.spawn(move || {
                        let far = Far {
                            gateways: &[],
                            peer,
                            key,
                        };
                        lane::receive(&mut ep, far, shape, sink, shared, done, false)
                            .map(|(d, _)| d)
                    })]
                }
            };
            let commit = wire_io::recv::<Request>(&mut self.stream, proto::MAX_REQUEST);
            if !matches!(commit, Ok(Request::Commit { .. })) {
                shared.abort.store(true, Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
            let results: Vec<_> = handles.into_iter().map(join).collect();
            (results, commit)
        });
        let cleanup = |x: &crate::ops::Export| {
            if matches!(landing, Landing::Replace { .. }) && !keep_partial {
                x.drop_partial(path);
            }
        };
        let (bytes, digest) = match commit {
            Ok(Request::Commit { bytes, digest }) => (bytes, digest),
            Ok(_) => {
                cleanup(&self.shared.export);
                self.reply(failure(Failure::new(Code::BadRequest, "expected a commit")))?;
                return Ok(());
            }
            Err(e) => {
                cleanup(&self.shared.export);
                return Err(e.into());
            }
        };
        let outcome = gather(&shape, results).and_then(|ours| {
            if bytes != shape.len || ours != digest {
                return Err(Failure::new(
                    Code::Mismatch,
                    format!("{path}: the data received does not match the client's digest"),
                ));
            }
            self.land(path, &file, size, sync, landing)
        });
        let msg = match outcome {
            Ok(()) => {
                self.shared.meter.moved("put", bytes);
                Reply::Ok
            }
            Err(f) => {
                if f.code == Code::Mismatch {
                    self.shared.export.drop_partial(path);
                } else {
                    cleanup(&self.shared.export);
                }
                failure(f)
            }
        };
        Ok(self.reply(msg)?)
    }

    /// Makes a received file final: its size, durability, its name.
    fn land(
        &self,
        path: &str,
        file: &std::fs::File,
        size: u64,
        sync: bool,
        landing: Landing,
    ) -> OpResult<()> {
        let fail = |e: io::Error| Failure::io(path, &e);
        if let Landing::Replace { .. } = landing {
            file.set_len(size).map_err(fail)?;
        }
        if sync {
            file.sync_all().map_err(fail)?;
        }
        if let Landing::Replace { .. } = landing {
            self.shared.export.commit_partial(path, sync)?;
        }
        Ok(())
    }
}

/// Where a `Put`'s data arrives.
enum Ends {
    /// Streams of puts into regions.
    Streams(Vec<Receiver>),
    /// Chunks through gateways, to an endpoint, of a transfer id.
    Lane(Box<Endpoint>, u64),
}

fn check_lane(l: &Lane) -> OpResult<()> {
    if l.gateways.is_empty() || l.gateways.len() > proto::MAX_GATEWAYS {
        return Err(Failure::new(
            Code::BadRequest,
            format!(
                "a lane of {} gateways (1 to {})",
                l.gateways.len(),
                proto::MAX_GATEWAYS
            ),
        ));
    }
    Ok(())
}

fn lane_gateways(l: &Lane) -> Vec<Addr> {
    l.gateways.iter().map(|g| Addr::new(g.0, g.1)).collect()
}

fn failure(f: Failure) -> Reply {
    Reply::Error {
        code: f.code,
        message: f.message,
    }
}
