//! Macro-cluster management as processes on loopback: a central manager
//! (h0) and one group of four hosts (h1..h4) whose manager is h1 and
//! fallback h2. Hosts are killed, frozen and brought back; what the
//! central manager decided shows in `manage status --json`, in its
//! decision log, and in the files its reset and exclude commands write.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

/// A cluster of five managed hosts and the processes of their stations.
struct Site {
    dir: tempfile::TempDir,
    file: PathBuf,
    names: Vec<String>,
    hosts: Vec<Option<Child>>,
    /// Where the central manager serves its metrics and page, if asked.
    web: Option<std::net::SocketAddr>,
    /// The network namespace every process runs in, if not this one's.
    ns: Option<String>,
}

impl Site {
    /// h0 the central manager, h1..h4 a group managed by h1 with h2 as
    /// its fallback; resets and exclusions written to files; `health` the
    /// health check.
    fn new(base: u16, health: Option<&str>) -> Site {
        Site::with(base, ["h0", "h1", "h2", "h3", "h4"], |d| {
            let mut manage = format!(
                "come_back_s = 30\nhealth_ms = 100\n\
                 reset_command = \"echo {{host}} >> {d}/resets\"\n\
                 exclude_command = \"echo {{host}} {{reason}} >> {d}/excluded\"\n"
            );
            if let Some(h) = health {
                manage += &format!("health_command = \"{h}\"\n");
            }
            manage
        })
    }

    /// Hosts `names` (the first the central manager, the second the
    /// group's manager, the third its fallback), with `manage(dir)` in the
    /// `[manage]` table beside fast probes and a short lease.
    fn with(base: u16, names: [&str; 5], manage: impl Fn(&str) -> String) -> Site {
        Site::in_ns(None, base, names, manage)
    }

    /// [`Site::with`], every process in namespace `ns` when given.
    fn in_ns(
        ns: Option<String>,
        base: u16,
        names: [&str; 5],
        manage: impl Fn(&str) -> String,
    ) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let more = manage(&dir.path().display().to_string());
        // The fast settings, but for those the test sets itself.
        let key = |l: &str| l.split('=').next().unwrap_or("").trim().to_string();
        let fast: String =
            "probe_ms = 100\nsuspicion_ms = 400\nlease_ms = 800\nagain_within_s = 60\n"
                .lines()
                .filter(|l| !more.lines().any(|m| key(m) == key(l)))
                .map(|l| format!("{l}\n"))
                .collect();
        let file =
            macrolink_testbed::site::write_managed(dir.path(), base, &names, &(fast + &more))
                .unwrap();
        let mut s = Site {
            dir,
            file,
            names: names.iter().map(|n| n.to_string()).collect(),
            hosts: (0..5).map(|_| None).collect(),
            web: None,
            ns,
        };
        for i in 0..5 {
            s.start(i);
        }
        s
    }

    fn start(&mut self, i: usize) {
        let mut web = Vec::new();
        if let (0, Some(at)) = (i, self.web) {
            web = vec!["--metrics".to_string(), at.to_string()];
        }
        let child = self
            .command()
            .args(["manage", "run"])
            .args(&web)
            .arg(&self.file)
            .args(["--host", &self.names[i], "--state-dir"])
            .arg(self.dir.path().join("state"))
            .env_remove("MACROLINK_SECRET")
            .env_remove("MACROLINK_SECRET_FILE")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.hosts[i] = Some(child);
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.hosts[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, i: usize, sig: i32) {
        let pid = self.hosts[i].as_ref().unwrap().id() as i32;
        // SAFETY: kill sends a signal to a process id; it touches no memory.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// `macrolink`, in the site's namespace if it has one (`ip netns exec`
    /// runs it in its own place: the child is `macrolink` itself).
    fn command(&self) -> Command {
        match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, EXE]);
                c
            }
            None => Command::new(EXE),
        }
    }

    fn manage(&self, args: &[&str]) -> std::process::Output {
        self.command()
            .arg("manage")
            .arg(args[0])
            .arg(&self.file)
            .args(&args[1..])
            .env_remove("MACROLINK_SECRET")
            .env_remove("MACROLINK_SECRET_FILE")
            .output()
            .unwrap()
    }

    fn status(&self) -> Value {
        let out = self.manage(&["status", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn state_of(&self, host: &str) -> String {
        self.status()["hosts"][host]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits up to `limit` for `ok`; how long it took.
    /// Every host of `hosts` healthy, within a few seconds: a host whose
    /// probes a loaded machine delayed may be suspect for a moment.
    fn all_healthy(&self, hosts: &[&str]) {
        self.until(Duration::from_secs(5), "every host healthy", |s| {
            let st = s.status();
            hosts.iter().all(|h| st["hosts"][h]["state"] == "healthy")
        });
    }

    fn until(&self, limit: Duration, what: &str, ok: impl Fn(&Site) -> bool) -> Duration {
        let start = Instant::now();
        while !ok(self) {
            assert!(
                start.elapsed() < limit,
                "{what}: not within {limit:?}\n{:#}",
                self.status()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        start.elapsed()
    }

    fn manager(&self) -> (String, u64) {
        let g = &self.status()["groups"][0];
        (
            g["manager"].as_str().unwrap_or("").to_string(),
            g["epoch"].as_u64().unwrap_or(0),
        )
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        for i in 0..5 {
            if let Some(c) = &self.hosts[i] {
                // SAFETY: kill sends a signal to a process id; it touches
                // no memory. A frozen host is thawed so that it can die.
                unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            }
            self.kill(i);
        }
    }
}

fn log(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("state/decisions.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_killed_host_is_reset_and_killed_again_excluded_and_the_central_manager_keeps_that() {
    let mut s = Site::new(7900, None);
    s.until(Duration::from_secs(10), "h1 manages", |s| {
        s.manager().0 == "h1"
    });
    s.kill(4);
    let took = s.until(Duration::from_secs(5), "h4 reset", |s| {
        s.lines("resets") == ["h4"]
    });
    eprintln!("a killed host reset after {took:?}");
    assert_eq!(s.state_of("h4"), "resetting");
    // The reset "worked": it comes back.
    s.start(4);
    s.until(Duration::from_secs(5), "h4 back", |s| {
        s.state_of("h4") == "healthy"
    });
    s.kill(4);
    s.until(Duration::from_secs(5), "h4 excluded", |s| {
        s.state_of("h4") == "excluded"
    });
    let excluded = s.lines("excluded");
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert!(excluded[0].starts_with("h4 failed again"), "{excluded:?}");
    assert_eq!(s.lines("resets"), ["h4"], "no second reset");
    // The central manager restarted keeps it all.
    s.kill(0);
    s.start(0);
    s.until(Duration::from_secs(10), "central back", |s| {
        s.manage(&["status", "--json"]).status.success()
    });
    let st = s.status();
    assert_eq!(st["hosts"]["h4"]["state"], "excluded", "{st:#}");
    assert_eq!(
        st["hosts"]["h4"]["actions"].as_array().unwrap().len(),
        2,
        "{st:#}"
    );
    s.all_healthy(&["h1", "h2", "h3"]);
    // An operator includes it again, once it answers; the log has every
    // decision.
    s.start(4);
    std::thread::sleep(Duration::from_secs(1));
    let out = s.manage(&["include", "h4", "--reason", "memory replaced"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.state_of("h4"), "healthy");
    let decided: Vec<(String, String)> = log(s.dir.path())
        .iter()
        .filter(|d| !d["action"].is_null())
        .map(|d| {
            (
                d["host"].as_str().unwrap().into(),
                d["action"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [("h4", "reset"), ("h4", "exclude"), ("h4", "include")];
    assert_eq!(decided, want.map(|(h, a)| (h.to_string(), a.to_string())));
    let table = s.manage(&["status"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("h4") && text.contains("reset,exclude,include"),
        "{text}"
    );
}

#[test]
fn the_fallback_takes_over_a_killed_manager_and_a_frozen_one_never_acts_again() {
    let mut s = Site::new(7950, None);
    s.until(Duration::from_secs(10), "h1 manages", |s| {
        s.manager().0 == "h1"
    });
    s.kill(1);
    let took = s.until(Duration::from_secs(5), "h2 takes over", |s| {
        s.manager().0 == "h2"
    });
    eprintln!("takeover after the manager was killed: {took:?}");
    // The new manager finds the old one failed and has it reset.
    s.until(Duration::from_secs(5), "h1 reset", |s| {
        s.lines("resets") == ["h1"]
    });
    // It comes back as the fallback.
    s.start(1);
    s.until(Duration::from_secs(5), "h1 back", |s| {
        s.state_of("h1") == "healthy"
    });
    let (who, epoch) = s.manager();
    assert_eq!(who, "h2");
    // The manager frozen: the fallback takes over; thawed, the old one
    // acts no more (its epoch is old) and nothing is done twice.
    s.signal(2, libc::SIGSTOP);
    s.until(Duration::from_secs(5), "h1 takes over", |s| {
        s.manager().0 == "h1"
    });
    std::thread::sleep(Duration::from_secs(2));
    s.signal(2, libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(2));
    let (who, now) = s.manager();
    assert_eq!(who, "h1");
    assert!(now > epoch, "{now} > {epoch}");
    // h2 was frozen for 2 s: failed and reset once, by h1's reports only.
    let resets = s.lines("resets");
    assert_eq!(
        resets.iter().filter(|r| *r == "h2").count(),
        1,
        "{resets:?}"
    );
    s.all_healthy(&["h2"]);
}

#[test]
fn a_fallback_that_stalls_reads_the_beats_that_came_meanwhile_and_takes_nothing_over() {
    // Probes patient enough that a stall of 2 s fails no host: only the
    // lease is at stake.
    let s = Site::with(8200, ["h0", "h1", "h2", "h3", "h4"], |d| {
        format!(
            "suspicion_ms = 5000\n\
             reset_command = \"echo {{host}} >> {d}/resets\"\n"
        )
    });
    s.until(Duration::from_secs(10), "h1 manages", |s| {
        s.manager().0 == "h1"
    });
    let before = s.manager();
    // Frozen for longer than its patience (one and a half leases), the
    // fallback wakes to h1's beats queued in its socket; it reads them
    // before it looks at the clock, and judges h1's silence by when they
    // came: h1 was never silent.
    s.signal(2, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2));
    s.signal(2, libc::SIGCONT);
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(s.manager(), before, "h1 keeps managing, in its epoch");
    }
    assert!(s.lines("resets").is_empty(), "{:?}", s.lines("resets"));
}

#[test]
fn a_partition_between_manager_and_fallback_leaves_one_acting_and_nothing_done_twice() {
    let Some(ns) = macrolink_testbed::require::namespaces(1) else {
        return;
    };
    let base = 8050;
    let mut s = Site::in_ns(
        Some(ns.names[0].clone()),
        base,
        ["h0", "h1", "h2", "h3", "h4"],
        |d| {
            format!(
                "come_back_s = 30\nhealth_ms = 100\n\
                 reset_command = \"echo {{host}} >> {d}/resets\"\n"
            )
        },
    );
    s.until(Duration::from_secs(10), "h1 manages", |s| {
        s.manager().0 == "h1"
    });
    // Cut h1 from h2 and h2 from h1 (their management ports), and nothing
    // else: the firewall of the site's namespace.
    let (p1, p2) = ((base + 11).to_string(), (base + 12).to_string());
    for (from, to) in [(&p1, &p2), (&p2, &p1)] {
        let rule = [
            "iptables", "-A", "INPUT", "-p", "udp", "--sport", from, "--dport", to, "-j", "DROP",
        ];
        macrolink_testbed::netns::in_ns(&ns.names[0], &rule).expect("iptables");
    }
    // h2 hears no beats and tries to take over, but the central manager
    // still hears h1 and refuses h2's newer epoch: h1 stays the one that
    // acts. Neither is failed: the other members answer for each
    // (indirect probes).
    let before = s.manager();
    assert_eq!(before.0, "h1");
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(s.manager(), before, "the central manager keeps h1");
    }
    // The central manager frozen for more than a lease: thawed, it reads
    // the beats of both that came meanwhile, in the order they came, and
    // judges h1's silence by when they came, not by when it read them.
    s.signal(0, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2));
    s.signal(0, libc::SIGCONT);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            s.manager(),
            before,
            "a stall of the central manager keeps h1"
        );
    }
    // A host killed meanwhile is reset once.
    s.kill(4);
    s.until(Duration::from_secs(5), "h4 reset", |s| {
        s.lines("resets") == ["h4"]
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(s.lines("resets"), ["h4"], "one reset, nothing done twice");
    let acted: Vec<Value> = log(s.dir.path())
        .into_iter()
        .filter(|d| !d["action"].is_null())
        .collect();
    assert_eq!(acted.len(), 1, "{acted:#?}");
    s.all_healthy(&["h1", "h2", "h3"]);
    assert_eq!(s.manager(), before);
    // The partition healed: h2's newer epoch reaches h1, which steps down;
    // once h1 is silent for a lease, the central manager takes h2 (or h1
    // keeps it): one manager either way, and still nothing done twice.
    let _ = macrolink_testbed::netns::in_ns(&ns.names[0], &["iptables", "-F", "INPUT"]);
    std::thread::sleep(Duration::from_secs(4));
    let (who, _) = s.manager();
    assert!(who == "h1" || who == "h2", "{who}");
    assert_eq!(s.lines("resets"), ["h4"]);
}

#[test]
fn a_health_check_that_crashes_is_unknown_and_leads_to_nothing() {
    let s = Site::new(8000, Some("exit 3"));
    s.until(Duration::from_secs(10), "health reported", |s| {
        s.status()["hosts"]["h3"]["health"]
            .as_str()
            .is_some_and(|h| h.contains("the health check itself failed"))
    });
    std::thread::sleep(Duration::from_secs(1));
    s.all_healthy(&["h1", "h2", "h3", "h4"]);
    assert!(s.lines("resets").is_empty());
}

#[test]
fn an_excluded_host_is_drained_in_slurm_and_an_included_one_resumed() {
    let Some(()) = macrolink_testbed::require::slurm() else {
        return;
    };
    // Hosts named as the Slurm nodes are (n1..n4; n0, the central manager,
    // is none of them).
    let mut s = Site::with(8050, ["n0", "n1", "n2", "n3", "n4"], |_| {
        "reset_command = \"true\"\n\
         exclude_command = \"scontrol update nodename={host} state=drain reason={reason}\"\n\
         include_command = \"scontrol update nodename={host} state=resume\"\n"
            .to_string()
    });
    let sinfo = |fmt: &str| {
        let o = Command::new("sinfo")
            .args(["-h", "-N", "-n", "n4", "-o", fmt])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // Whatever happens, n4 is back in service for the tests after this.
    struct Resume;
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = Command::new("scontrol")
                .args(["update", "nodename=n4", "state=resume"])
                .output();
        }
    }
    let _resume = Resume;
    s.until(Duration::from_secs(10), "n1 manages", |s| {
        s.manager().0 == "n1"
    });
    s.kill(4);
    s.until(Duration::from_secs(5), "n4 reset", |s| {
        s.state_of("n4") == "resetting"
    });
    s.start(4);
    s.until(Duration::from_secs(5), "n4 back", |s| {
        s.state_of("n4") == "healthy"
    });
    s.kill(4);
    s.until(Duration::from_secs(5), "n4 excluded", |s| {
        s.state_of("n4") == "excluded"
    });
    s.until(Duration::from_secs(10), "n4 drained", |_| {
        sinfo("%E").starts_with("failed again")
    });
    eprintln!("sinfo -R: n4 {} ({})", sinfo("%T"), sinfo("%E"));
    s.start(4);
    let out = s.manage(&["include", "n4", "--reason", "checked"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.until(Duration::from_secs(10), "n4 resumed", |_| {
        sinfo("%T") == "idle"
    });
}

/// `GET path` from `at`: the body.
fn get(at: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(at).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|b| b.1.to_string())
        .unwrap_or_default()
}

#[test]
fn metrics_and_the_status_page_in_a_real_browser_show_a_reset_host() {
    let Some(()) = macrolink_testbed::require::program("chromium", "MACROLINK_REQUIRE_BROWSER")
    else {
        return;
    };
    let mut s = Site::new(8100, None);
    // The central manager again, with its window open.
    s.web = Some("127.0.0.1:8149".parse().unwrap());
    s.kill(0);
    s.start(0);
    let at = s.web.unwrap();
    s.until(Duration::from_secs(10), "h1 manages", |s| {
        s.manager().0 == "h1"
    });
    s.kill(4);
    s.until(Duration::from_secs(5), "h4 reset", |s| {
        s.state_of("h4") == "resetting"
    });
    let m = get(at, "/metrics");
    for want in [
        r#"macrolink_manage_host_state{host="h4",group="m0",state="resetting"} 1"#,
        r#"macrolink_manage_host_state{host="h3",group="m0",state="healthy"} 1"#,
        r#"macrolink_manage_actions_total{action="reset"} 1"#,
        r#"macrolink_manage_epoch{group="m0"} 1"#,
    ] {
        assert!(m.contains(want), "{want}\n{m}");
    }
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://{at}/"))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        dom.contains(r#"<tr class="resetting" data-host="h4">"#),
        "{dom}"
    );
    assert!(
        dom.contains("<td>h1</td><td>1</td>"),
        "the group's manager and epoch: {dom}"
    );
    for h in ["h1", "h2", "h3"] {
        assert!(
            dom.contains(&format!(r#"<tr class="healthy" data-host="{h}">"#)),
            "{dom}"
        );
    }
}

#[test]
fn strangers_replays_and_floods_change_nothing() {
    use macrolink_fabric::seal::{Seal, TAG_LEN};
    use macrolink_wire::manage::{Body, Message, OrderKind};
    let s = Site::new(8150, None);
    s.until(Duration::from_secs(10), "h1 manages", |s| {
        s.manager().0 == "h1"
    });
    let central: std::net::SocketAddr = "127.0.0.1:8160".parse().unwrap();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sealed = |seal: &Seal, body: Body<'_>| {
        let mut b = Message { from: 0, body }.encode().unwrap();
        let n = b.len();
        b.resize(n + TAG_LEN, 0);
        let n = seal.close(&mut b, n);
        b.truncate(n);
        b
    };
    let order = |sent_ms| Body::Order {
        nonce: rand_nonce(),
        sent_ms,
        host: 5, // h4
        order: OrderKind::Exclude,
        text: "attacker",
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // The right key, but an order a minute old (a replay).
    let key = macrolink_files::setup::load_secret(Some(&s.dir.path().join("secret")))
        .unwrap()
        .fabric_key();
    let right = Seal::new(key.derive(macrolink_managenet::SEAL_CONTEXT));
    sock.send_to(&sealed(&right, order(now_ms - 60_000)), central)
        .unwrap();
    // A fresh order under a wrong key; and a flood of garbage.
    let wrong = Seal::new([7; 32]);
    sock.send_to(&sealed(&wrong, order(now_ms)), central)
        .unwrap();
    for i in 0..5000u32 {
        let junk: Vec<u8> = (0..(i % 300)).map(|j| (i ^ j) as u8).collect();
        let _ = sock.send_to(&junk, central);
    }
    // No reply to any of them, and the central manager still answers.
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 2048];
    assert!(sock.recv_from(&mut buf).is_err(), "a stranger got a reply");
    s.all_healthy(&["h1", "h2", "h3", "h4"]);
    assert!(log(s.dir.path()).iter().all(|d| d["action"].is_null()));
    // The same order, fresh and under the right key, is carried out: the
    // refusals above were the checks', not an address that nobody hears.
    sock.send_to(&sealed(&right, order(now_ms + 1)), central)
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(sock.recv_from(&mut buf).is_ok(), "no reply to a good order");
    assert_eq!(s.state_of("h4"), "excluded");
}

fn rand_nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}
