//! A server and clients in one process, over shared memory and TCP.

use macrolink_fabric::{Transport, UcxOptions};
use macrolink_files::auth::Secret;
use macrolink_files::copy::{Copier, CopyOptions, Location};
use macrolink_files::data::Sink;
use macrolink_files::proto::{self, Code, Kind, Reply, Request};
use macrolink_files::uncached::Uncached;
use macrolink_files::{exit, Client, ClientOptions, Error, Limits, ServeConfig, Server};
use macrolink_testbed::data::pattern;
use macrolink_testbed::pages::{cached_bytes, cached_bytes_within};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};

const SECRET: &[u8] = b"test secret of enough bytes";

struct Fixture {
    dir: tempfile::TempDir,
    addr: String,
}

impl Fixture {
    fn root(&self) -> PathBuf {
        self.dir.path().join("export")
    }
    fn local(&self) -> PathBuf {
        self.dir.path().join("local")
    }
    fn shm(&self) -> PathBuf {
        self.dir.path().join("shm")
    }
    fn url(&self, path: &str) -> Location {
        format!("ml://{}/{path}", self.addr).parse().unwrap()
    }
    fn options(&self, transport: Transport) -> CopyOptions {
        CopyOptions {
            client: ClientOptions {
                shm_dir: self.shm(),
                no_shm: transport == Transport::Tcp,
                ..ClientOptions::default()
            },
            ..CopyOptions::default()
        }
    }
    fn copier(&self, transport: Transport) -> Copier {
        Copier::new(Secret::new(SECRET).unwrap(), self.options(transport))
    }
    fn client(&self, secret: &[u8]) -> Result<Client, Error> {
        let opts = ClientOptions {
            shm_dir: self.shm(),
            ..ClientOptions::default()
        };
        Client::connect(&self.addr, &Secret::new(secret).unwrap(), &opts)
    }
}

fn serve(read_only: bool, limits: Limits) -> Fixture {
    serve_with(read_only, limits, None)
}

fn serve_with(read_only: bool, limits: Limits, ucx: Option<UcxOptions>) -> Fixture {
    serve_config(read_only, limits, ucx, false)
}

fn serve_config(read_only: bool, limits: Limits, ucx: Option<UcxOptions>, cache: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    for d in ["export", "local", "shm"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    let server = Server::bind(ServeConfig {
        root: dir.path().join("export"),
        listen: "127.0.0.1:0".parse().unwrap(),
        secret: Secret::new(SECRET).unwrap(),
        read_only,
        limits,
        shm_dir: dir.path().join("shm"),
        fabric: None,
        excluded: None,
        meter: Default::default(),
        ucx,
        cache,
    })
    .unwrap();
    let addr = server.local_addr().unwrap().to_string();
    std::thread::spawn(move || server.run());
    Fixture { dir, addr }
}

fn no_partials(dir: &Path) {
    for e in walk(dir) {
        assert!(
            !e.to_string_lossy().ends_with(".ml-part"),
            "partial file left: {}",
            e.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn files_of_every_size_round_trip_over_shm_and_tcp() {
    let f = serve(false, Limits::default());
    for transport in [Transport::Shm, Transport::Tcp] {
        let mut opts = f.options(transport);
        opts.streams = 3;
        opts.chunk = 64 << 10;
        opts.slots = 4;
        let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
        for (i, size) in [0usize, 1, 4095, (1 << 20) + 1].into_iter().enumerate() {
            let data = pattern(size, i as u64 + 7);
            let src = f.local().join(format!("up-{transport}-{size}"));
            std::fs::write(&src, &data).unwrap();
            let name = format!("f-{transport}-{size}");
            let r = c.copy(&Location::Local(src), &f.url(&name)).unwrap();
            assert_eq!((r.files, r.bytes), (1, size as u64));
            assert_eq!(std::fs::read(f.root().join(&name)).unwrap(), data);
            let back = f.local().join(format!("down-{transport}-{size}"));
            let r = c
                .copy(&f.url(&name), &Location::Local(back.clone()))
                .unwrap();
            assert_eq!((r.files, r.bytes), (1, size as u64));
            assert_eq!(std::fs::read(&back).unwrap(), data, "size {size}");
        }
        assert_eq!(
            f.client(SECRET).unwrap().transport(),
            Transport::Shm,
            "same host, same directory"
        );
    }
    no_partials(f.dir.path());
}

/// UCX, forced onto its tcp transport: a server and a client that both
/// start it move file data over it (and would over InfiniBand).
#[test]
fn files_round_trip_over_ucx_when_both_ends_speak_it() {
    let ucx = UcxOptions {
        tls: Some("tcp".into()),
        devices: None,
    };
    let probe = tempfile::tempdir().unwrap();
    let mut cfg = macrolink_fabric::NodeConfig::local(1, probe.path());
    cfg.ucx = Some(ucx.clone());
    if macrolink_testbed::require::ucx(macrolink_fabric::Node::start(cfg)).is_none() {
        return;
    }
    let f = serve_with(false, Limits::default(), Some(ucx.clone()));
    let mut opts = f.options(Transport::Tcp);
    opts.client.ucx = Some(ucx);
    opts.streams = 2;
    opts.chunk = 256 << 10;
    let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts.clone());
    for (i, size) in [0usize, 1, (3 << 20) + 5].into_iter().enumerate() {
        let data = pattern(size, i as u64 + 70);
        let src = f.local().join(format!("ucx-up-{size}"));
        std::fs::write(&src, &data).unwrap();
        let name = format!("ucx-{size}");
        let r = c.copy(&Location::Local(src), &f.url(&name)).unwrap();
        assert_eq!((r.files, r.bytes), (1, size as u64));
        assert_eq!(std::fs::read(f.root().join(&name)).unwrap(), data);
        let back = f.local().join(format!("ucx-down-{size}"));
        c.copy(&f.url(&name), &Location::Local(back.clone()))
            .unwrap();
        assert_eq!(std::fs::read(&back).unwrap(), data, "size {size}");
    }
    let client = Client::connect(&f.addr, &Secret::new(SECRET).unwrap(), &opts.client).unwrap();
    assert_eq!(client.transport(), Transport::Ucx);
    no_partials(f.dir.path());
}

#[test]
fn a_large_file_round_trips_with_parallel_streams() {
    let f = serve(false, Limits::default());
    let data = pattern(256 << 20, 99);
    let src = f.local().join("big");
    std::fs::write(&src, &data).unwrap();
    let mut opts = f.options(Transport::Shm);
    opts.streams = 2;
    let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
    c.copy(&Location::Local(src), &f.url("big")).unwrap();
    let back = f.local().join("big.back");
    let r = c
        .copy(&f.url("big"), &Location::Local(back.clone()))
        .unwrap();
    assert_eq!(r.bytes, 256 << 20);
    assert!(std::fs::read(&back).unwrap() == data, "content differs");
    // Unverified: nothing hashed, the bytes still right.
    let mut opts = f.options(Transport::Tcp);
    opts.verify = false;
    let mut quick = Copier::new(Secret::new(SECRET).unwrap(), opts);
    let plain = f.local().join("big.plain");
    quick
        .copy(&f.url("big"), &Location::Local(plain.clone()))
        .unwrap();
    assert!(
        std::fs::read(&plain).unwrap() == data,
        "unverified copy differs"
    );
    // To a device: written in place, nothing renamed over it.
    let r = c
        .copy(&f.url("big"), &Location::Local("/dev/null".into()))
        .unwrap();
    assert_eq!(r.bytes, 256 << 20);
    no_partials(f.dir.path());
}

#[test]
fn copies_written_past_the_page_cache_are_whole_both_ways() {
    let f = serve(false, Limits::default());
    // Whole chunks go by direct I/O, the ragged tail through the cache.
    let data = pattern((8 << 20) + 1234, 5);
    let src = f.local().join("d");
    std::fs::write(&src, &data).unwrap();
    for transport in [Transport::Shm, Transport::Tcp] {
        let mut opts = f.options(transport);
        (opts.streams, opts.direct) = (2, true);
        let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
        let name = format!("d.{transport:?}");
        let r = c
            .copy(&Location::Local(src.clone()), &f.url(&name))
            .unwrap();
        assert_eq!(r.bytes, data.len() as u64);
        let up = std::fs::read(f.root().join(&name)).unwrap();
        assert!(up == data, "{transport:?}: the upload differs");
        let back = f.local().join(format!("{name}.back"));
        let r = c
            .copy(&f.url(&name), &Location::Local(back.clone()))
            .unwrap();
        assert_eq!(r.bytes, data.len() as u64);
        assert!(
            std::fs::read(&back).unwrap() == data,
            "{transport:?}: the download differs"
        );
    }
    no_partials(f.dir.path());
}

/// Whether files in `dir` can be written uncached (the kernel and the file
/// system take `RWF_DONTCACHE`).
fn uncached_here(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let file = std::fs::File::create(&probe).unwrap();
    let w = Uncached::from(&file, 0);
    w.write_at(&[1; 4096], 0).unwrap();
    std::fs::remove_file(probe).unwrap();
    !w.refused()
}

#[test]
fn large_copies_keep_only_their_head_cached_unless_told_to_keep_it_all() {
    const HEAD: u64 = macrolink_files::uncached::HEAD;
    let data = pattern(HEAD as usize + (32 << 20) + 4321, 21);
    let len = data.len() as u64;
    // The head and a tenth of the rest may stay: the last pages written
    // back may not yet be freed.
    let at_most = HEAD + (len - HEAD) / 10;
    let patience = std::time::Duration::from_secs(5);
    for keep in [false, true] {
        let f = serve_config(false, Limits::default(), None, keep);
        let src = f.local().join("big");
        std::fs::write(&src, &data).unwrap();
        let mut opts = f.options(Transport::Shm);
        (opts.streams, opts.cache) = (2, keep);
        let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
        let uncached = !keep && uncached_here(f.dir.path());
        // What each copy left cached, once written back (so that what is
        // cached is what stays), before anything reads it: the download
        // reads the upload, and reading caches.
        let left = |what: &str, p: &Path| {
            std::fs::File::open(p).unwrap().sync_all().unwrap();
            if uncached {
                let kept = cached_bytes_within(p, at_most, patience).unwrap();
                assert!(
                    kept >= HEAD,
                    "{what}: {kept} bytes cached, fewer than the head"
                );
                assert!(
                    kept <= at_most,
                    "{what}: {kept} of {len} bytes still cached"
                );
            } else {
                // The page cache's own writes (asked for, or the only
                // ones here): the whole file.
                let kept = cached_bytes(p).unwrap();
                assert_eq!(kept, len.div_ceil(4096) * 4096, "{what} (keep {keep})");
            }
        };
        c.copy(&Location::Local(src), &f.url("big")).unwrap();
        let up = f.root().join("big");
        left("the server", &up);
        let back = f.local().join("big.back");
        c.copy(&f.url("big"), &Location::Local(back.clone()))
            .unwrap();
        left("the client", &back);
        assert!(std::fs::read(&up).unwrap() == data, "the upload differs");
        assert!(
            std::fs::read(&back).unwrap() == data,
            "the download differs"
        );
        no_partials(f.dir.path());
    }
}

#[test]
fn directories_copy_both_ways_and_metadata_ops_work() {
    let f = serve(false, Limits::default());
    let tree = f.local().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::create_dir_all(tree.join("empty")).unwrap();
    std::fs::write(tree.join("top"), b"top").unwrap();
    std::fs::write(tree.join("a/b/deep"), pattern(70_000, 3)).unwrap();
    let mut c = f.copier(Transport::Shm);
    assert_eq!(
        c.copy(&Location::Local(tree.clone()), &f.url("t"))
            .unwrap_err()
            .exit_code(),
        exit::USAGE,
        "a directory needs -r"
    );
    let mut opts = f.options(Transport::Shm);
    opts.recursive = true;
    let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
    let r = c.copy(&Location::Local(tree.clone()), &f.url("")).unwrap();
    assert_eq!(r.files, 2);
    assert_eq!(
        std::fs::read(f.root().join("tree/a/b/deep")).unwrap(),
        pattern(70_000, 3)
    );
    assert!(f.root().join("tree/empty").is_dir());
    let back = f.local().join("back");
    c.copy(&f.url("tree"), &Location::Local(back.clone()))
        .unwrap();
    assert_eq!(std::fs::read(back.join("top")).unwrap(), b"top");
    assert_eq!(
        std::fs::read(back.join("a/b/deep")).unwrap(),
        pattern(70_000, 3)
    );

    let mut cl = f.client(SECRET).unwrap();
    let names: Vec<_> = cl
        .list("tree")
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["a", "empty", "top"]);
    assert_eq!(cl.stat("tree/top").unwrap().size, 3);
    assert_eq!(cl.stat("tree").unwrap().kind, Kind::Dir);
    cl.mkdir("x/y", true).unwrap();
    let e = cl.mkdir("x", false).unwrap_err();
    assert_eq!(e.exit_code(), exit::CONFLICT, "{e}");
    let e = cl.remove("tree", false).unwrap_err();
    assert_eq!(e.exit_code(), exit::CONFLICT, "not empty: {e}");
    cl.remove("tree", true).unwrap();
    assert!(!f.root().join("tree").exists());
    let e = cl.stat("tree").unwrap_err();
    assert_eq!(e.exit_code(), exit::NOT_FOUND);
}

#[test]
fn wrong_secret_is_refused_before_any_operation() {
    let f = serve(false, Limits::default());
    let e = f.client(b"not the right secret at all").unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Remote {
                code: Code::Auth,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.exit_code(), exit::REFUSED);
    // A client that skips authentication gets nothing done.
    let mut s = TcpStream::connect(&f.addr).unwrap();
    let _challenge = read_reply(&mut s);
    s.write_all(&proto::encode(&Request::Remove {
        path: "x".into(),
        recursive: true,
    }))
    .unwrap();
    assert!(matches!(
        read_reply(&mut s),
        Some(Reply::Error {
            code: Code::Auth,
            ..
        })
    ));
}

fn read_reply(s: &mut TcpStream) -> Option<Reply> {
    let mut p = [0u8; 4];
    s.read_exact(&mut p).ok()?;
    let mut body = vec![0u8; proto::frame_len(p, proto::MAX_REPLY).ok()?];
    s.read_exact(&mut body).ok()?;
    proto::decode(&body).ok()
}

#[test]
fn paths_that_leave_the_export_are_refused() {
    let f = serve(false, Limits::default());
    std::fs::write(f.dir.path().join("outside"), b"secret").unwrap();
    std::os::unix::fs::symlink("..", f.root().join("up")).unwrap();
    let mut cl = f.client(SECRET).unwrap();
    for p in [
        "../outside",
        "/etc/passwd",
        "a/../../outside",
        "up/outside",
        "up",
    ] {
        let e = cl.stat(p).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Remote {
                    code: Code::Escape,
                    ..
                }
            ),
            "{p}: {e:?}"
        );
    }
    let mut c = f.copier(Transport::Shm);
    let src = f.local().join("f");
    std::fs::write(&src, b"data").unwrap();
    for p in ["../evil", "up/evil", "/tmp/evil"] {
        let e = c
            .copy(&Location::Local(src.clone()), &f.url(p))
            .unwrap_err();
        assert_eq!(e.exit_code(), exit::REFUSED, "{p}: {e}");
    }
    let e = c
        .copy(
            &f.url("up/outside"),
            &Location::Local(f.local().join("got")),
        )
        .unwrap_err();
    assert_eq!(e.exit_code(), exit::REFUSED);
    assert!(!f.dir.path().join("evil").exists());
    assert!(!f.local().join("got").exists());
}

#[test]
fn read_only_exports_refuse_writes_and_serve_reads() {
    let f = serve(true, Limits::default());
    std::fs::write(f.root().join("ro"), b"read me").unwrap();
    let mut c = f.copier(Transport::Tcp);
    let src = f.local().join("f");
    std::fs::write(&src, b"data").unwrap();
    let e = c.copy(&Location::Local(src), &f.url("new")).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Remote {
                code: Code::ReadOnly,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!f.root().join("new").exists());
    no_partials(&f.root());
    let got = f.local().join("ro");
    c.copy(&f.url("ro"), &Location::Local(got.clone())).unwrap();
    assert_eq!(std::fs::read(got).unwrap(), b"read me");
    let mut cl = f.client(SECRET).unwrap();
    assert!(cl.remove("ro", false).is_err());
    assert!(f.root().join("ro").exists());
}

#[test]
fn malformed_requests_get_an_error_and_others_are_still_served() {
    let f = serve(false, Limits::default());
    let mut good = f.client(SECRET).unwrap();
    // Authenticated, then garbage.
    let mut bad = TcpStream::connect(&f.addr).unwrap();
    let Some(Reply::Challenge { nonce, .. }) = read_reply(&mut bad) else {
        panic!("no challenge")
    };
    let secret = Secret::new(SECRET).unwrap();
    bad.write_all(&proto::encode(&Request::Auth {
        version: proto::VERSION,
        proof: secret.client_proof(&nonce),
        nonce: [0; 32],
        fabric: proto::FabricInfo {
            node: 1,
            host: String::new(),
            shm_dir: String::new(),
            tcp: "127.0.0.1:1".into(),
            shm: false,
            ucx: false,
        },
    }))
    .unwrap();
    assert!(matches!(read_reply(&mut bad), Some(Reply::Welcome { .. })));
    bad.write_all(&[5, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb])
        .unwrap();
    assert!(matches!(
        read_reply(&mut bad),
        Some(Reply::Error {
            code: Code::BadRequest,
            ..
        })
    ));
    // An oversized frame too.
    let mut big = TcpStream::connect(&f.addr).unwrap();
    let _ = read_reply(&mut big);
    big.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(matches!(read_reply(&mut big), Some(Reply::Error { .. })));
    // A well-formed request out of turn is refused and the session goes on.
    assert!(good.mkdir("still", false).is_ok());
    let e = good.sums("nothing", 1, false).unwrap_err();
    assert!(matches!(
        e,
        Error::Remote {
            code: Code::BadRequest,
            ..
        }
    ));
    assert_eq!(good.stat("still").unwrap().kind, Kind::Dir);
}

#[test]
fn connection_limits_are_enforced() {
    let f = serve(
        false,
        Limits {
            connections_per_client: 2,
            ..Limits::default()
        },
    );
    let _a = f.client(SECRET).unwrap();
    let _b = f.client(SECRET).unwrap();
    let e = f.client(SECRET).unwrap_err();
    assert_eq!(e.exit_code(), exit::BUSY, "{e}");
    drop(_a);
    // The slot comes back once the server notices the close.
    let mut ok = false;
    for _ in 0..50 {
        if f.client(SECRET).is_ok() {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(ok, "a closed connection frees its slot");
}

#[test]
fn a_file_striped_over_two_servers_round_trips() {
    let a = serve(false, Limits::default());
    let b = serve(false, Limits::default());
    let data = pattern(5 * (1 << 20) + 17, 11);
    let src = a.local().join("striped");
    std::fs::write(&src, &data).unwrap();
    let mut opts = a.options(Transport::Shm);
    opts.chunk = 64 << 10;
    opts.streams = 2;
    // Both fixtures meet in a's shm directory only for a; b is reached
    // over TCP then, which is what two storage hosts would be.
    let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
    let url: Location = format!("ml://{},{}/s", a.addr, b.addr).parse().unwrap();
    let r = c.copy(&Location::Local(src), &url).unwrap();
    assert_eq!(r.bytes, data.len() as u64);
    // Object 0 holds stripes 0, 2, 4, ...; object 1 stripes 1, 3, 5, ...
    let stripe = 64 << 10;
    let o0 = std::fs::read(a.root().join("s")).unwrap();
    let o1 = std::fs::read(b.root().join("s")).unwrap();
    assert_eq!(o0.len() + o1.len(), data.len());
    assert_eq!(&o0[..stripe], &data[..stripe]);
    assert_eq!(&o1[..stripe], &data[stripe..2 * stripe]);
    assert_eq!(&o0[stripe..2 * stripe], &data[2 * stripe..3 * stripe]);
    let back = a.local().join("back");
    let r = c.copy(&url, &Location::Local(back.clone())).unwrap();
    assert_eq!(r.bytes, data.len() as u64);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "striped copy differs"
    );
    // Written past the page cache: whole stripes by direct I/O, the ragged
    // tail through the cache.
    let mut opts = a.options(Transport::Shm);
    (opts.chunk, opts.streams, opts.direct) = (64 << 10, 2, true);
    let mut direct = Copier::new(Secret::new(SECRET).unwrap(), opts);
    let past = a.local().join("past");
    direct.copy(&url, &Location::Local(past.clone())).unwrap();
    assert!(
        std::fs::read(&past).unwrap() == data,
        "striped copy past the page cache differs"
    );
    // Servers named out of order are caught by the layout records.
    let swapped: Location = format!("ml://{},{}/s", b.addr, a.addr).parse().unwrap();
    let e = c
        .copy(&swapped, &Location::Local(a.local().join("bad")))
        .unwrap_err();
    assert!(e.to_string().contains("stripe order"), "{e}");
    assert!(!a.local().join("bad").exists());
    no_partials(a.dir.path());
}

/// Client options whose data for the fixture's server goes through a lane
/// of `gateways` (node, address) pairs.
fn through(f: &Fixture, gateways: &[(u32, &str)]) -> ClientOptions {
    let mut opts = ClientOptions {
        shm_dir: f.shm(),
        ..ClientOptions::default()
    };
    opts.lanes.insert(
        f.addr.parse().unwrap(),
        macrolink_files::lane::Route {
            gateways: gateways
                .iter()
                .map(|(n, a)| (macrolink_fabric::Addr::new(*n, 1), a.parse().unwrap()))
                .collect(),
            send: Default::default(),
        },
    );
    opts
}

#[test]
fn a_lane_no_gateway_answers_on_fails_cleanly_and_the_session_goes_on() {
    let f = serve(false, Limits::default());
    std::fs::write(f.root().join("f"), pattern(100_000, 1)).unwrap();
    let secret = Secret::new(SECRET).unwrap();
    // A lane of no gateways at all is a bad request.
    let mut c = Client::connect(&f.addr, &secret, &through(&f, &[])).unwrap();
    let shape = proto::Shape {
        offset: 0,
        len: u64::MAX,
        chunk: 64 << 10,
        slots: 4,
    };
    let shared = macrolink_files::data::Shared::default();
    let got = c.get(
        "f",
        shape,
        1,
        &macrolink_files::data::Discard,
        &shared,
        &mut |_, _| Ok(()),
    );
    assert!(
        matches!(
            &got,
            Err(Error::Remote {
                code: Code::BadRequest,
                ..
            })
        ),
        "{got:?}"
    );
    // A gateway nobody listens at: the server hears no hello and says so.
    let mut c = Client::connect(&f.addr, &secret, &through(&f, &[(99, "127.0.0.1:1")])).unwrap();
    let got = c.get(
        "f",
        shape,
        1,
        &macrolink_files::data::Discard,
        &shared,
        &mut |_, _| Ok(()),
    );
    match &got {
        Err(
            e @ Error::Remote {
                code: Code::Lost, ..
            },
        ) => {
            assert!(e.to_string().contains("no gateway"), "{e}");
            assert_eq!(e.exit_code(), exit::CONNECTION);
        }
        other => panic!("expected a lost transfer, got {other:?}"),
    }
    // The same connection still answers.
    assert_eq!(c.stat("f").unwrap().size, 100_000);
}

/// A client that announces a 1000-byte request, then sends one byte of it
/// every 200 ms; how long until the server cut it (None: never, in
/// `limit`).
fn slow_drip(addr: &str, limit: std::time::Duration) -> Option<std::time::Duration> {
    let start = std::time::Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut challenge = [0u8; 256];
    let _ = s.read(&mut challenge);
    s.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    s.write_all(&1000u32.to_le_bytes()).unwrap();
    while start.elapsed() < limit {
        if s.write_all(&[0]).is_err() {
            return Some(start.elapsed());
        }
        match s.read(&mut challenge) {
            Ok(0) => return Some(start.elapsed()),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return Some(start.elapsed()),
            _ => {}
        }
    }
    None
}

#[test]
fn slow_drip_clients_are_cut_at_the_deadline_and_good_ones_still_get_in() {
    let limits = Limits {
        handshake_time: std::time::Duration::from_secs(1),
        handshakes_per_client: 4,
        handshakes: 8,
        ..Limits::default()
    };
    let f = serve(false, limits);
    let attackers: Vec<_> = (0..16)
        .map(|_| {
            let addr = f.addr.clone();
            std::thread::spawn(move || slow_drip(&addr, std::time::Duration::from_secs(8)))
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // While they hold on, a good client from the same address gets in.
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let c = f.client(SECRET);
        assert!(c.is_ok(), "{:?}", c.err());
        assert!(t.elapsed() < std::time::Duration::from_secs(3));
    }
    for a in attackers {
        let cut = a.join().unwrap().expect("the server cut the slow client");
        // One deadline for the whole exchange (1 s), however it trickles.
        assert!(cut < std::time::Duration::from_millis(2500), "{cut:?}");
    }
}

/// Dials every endpoint of every node that meets in `shm` (and of the
/// server's node over tcp at `tcp`) from a node with `key`, and writes to
/// whatever answers, until `stop`; returns how many connections were
/// refused as not of the endpoint's session.
fn stranger(
    key: macrolink_fabric::Key,
    shm: &Path,
    tcp: (u32, std::net::SocketAddr),
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    use macrolink_fabric::{Addr, EndpointConfig, Error, Mode, Node, NodeConfig, Refusal};
    let mut cfg = NodeConfig::local(4242, shm);
    cfg.key = Some(key);
    let node = Node::start(cfg).unwrap();
    node.add_peer(tcp.0, tcp.1);
    let mut ep = node.open(1, EndpointConfig::default()).unwrap();
    let mut refused = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < until {
        let mut nodes = vec![(tcp.0, Transport::Tcp)];
        for e in std::fs::read_dir(shm).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if let Some(id) = n
                .strip_prefix("node-")
                .and_then(|r| r.strip_suffix(".sock"))
            {
                match id.parse::<u32>() {
                    Ok(id) if id != 4242 => nodes.push((id, Transport::Shm)),
                    _ => {}
                }
            }
        }
        for (id, t) in nodes {
            for e in 1..64 {
                match ep.target_via(Addr::new(id, e), Mode::Reliable, t) {
                    Ok(target) => {
                        let _ = ep.write(target, b"x");
                    }
                    Err(Error::Refused {
                        why: Refusal::OtherSession,
                        ..
                    }) => refused += 1,
                    Err(_) => {}
                }
            }
        }
    }
    refused
}

#[test]
fn strangers_frames_to_every_endpoint_of_a_running_session_change_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = serve(false, Limits::default());
    let data = pattern(64 << 20, 5);
    let src = f.local().join("src");
    std::fs::write(&src, &data).unwrap();
    let info = f.client(SECRET).unwrap().server_fabric().clone();
    let server = (info.node, info.tcp.parse().unwrap());
    for (who, key) in [
        (
            "a node without the secret",
            b"not the test secret at all".as_slice(),
        ),
        ("a member of the fabric", SECRET),
    ] {
        for transport in [Transport::Shm, Transport::Tcp] {
            let stop = AtomicBool::new(false);
            let key = macrolink_fabric::Key::from_secret(key).unwrap();
            let shm = f.shm();
            let refused = std::thread::scope(|s| {
                let attacker = s.spawn(|| stranger(key, &shm, server, &stop));
                let mut opts = f.options(transport);
                opts.streams = 2;
                // Slow enough (about 1 s each way) for the stranger to
                // find the sessions' endpoints while they serve.
                opts.limit_rate = Some(64 << 20);
                let mut c = Copier::new(Secret::new(SECRET).unwrap(), opts);
                let up = c.copy(&Location::Local(src.clone()), &f.url("target"));
                let back = f.local().join("back");
                let down = c.copy(&f.url("target"), &Location::Local(back.clone()));
                stop.store(true, Ordering::Relaxed);
                let refused = attacker.join().unwrap();
                up.unwrap();
                down.unwrap();
                assert!(
                    std::fs::read(&back).unwrap() == data,
                    "{who}, {transport}: content differs"
                );
                refused
            });
            eprintln!("{who}, {transport}: {refused} refused as strangers to a session");
            if who.starts_with("a member") {
                assert!(refused > 0, "{transport}: the attack reached sessions");
            }
        }
    }
    no_partials(f.dir.path());
}
