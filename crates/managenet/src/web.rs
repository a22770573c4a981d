//! The central manager's window, over HTTP: `/metrics` in the format
//! Prometheus scrapes (host states, decisions, actions, each group's
//! epoch), `/` a status page for people (the same as `manage status`,
//! refreshed every two seconds), `/status.json` the state itself.
//!
//! The listener is `macrolink-metrics`' (bounded for strangers: one
//! exchange at a time within its deadline); it reads the state, never
//! changes it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::io;
use std::net::TcpListener;
use std::sync::{Arc, Mutex, PoisonError};

/// Labels of a host's state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    /// Host name.
    pub host: String,
    /// Its group.
    pub group: String,
    /// One of the states.
    pub state: String,
}

/// Labels of an action.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// reset, exclude or include.
    pub action: String,
}

/// Labels of a group.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// Group name.
    pub group: String,
}

/// What the central manager shows.
#[derive(Debug)]
pub struct Window {
    registry: Arc<Registry>,
    /// 1 for a host's present state, 0 for the others.
    pub host_state: Family<HostLabels, Gauge>,
    /// Actions decided, by kind.
    pub actions: Family<ActionLabels, Counter>,
    /// Decisions logged.
    pub decisions: Counter,
    /// Each group's epoch, as the central manager last took it.
    pub epoch: Family<GroupLabels, Gauge>,
    status: Mutex<String>,
}

/// Every state a host can be in, as the status names them.
pub const STATES: [&str; 5] = ["healthy", "suspect", "failed", "resetting", "excluded"];

impl Window {
    /// An empty window.
    pub fn new() -> Arc<Window> {
        let mut registry = Registry::with_prefix("macrolink_manage");
        let host_state = Family::<HostLabels, Gauge>::default();
        let actions = Family::<ActionLabels, Counter>::default();
        let decisions = Counter::default();
        let epoch = Family::<GroupLabels, Gauge>::default();
        registry.register(
            "host_state",
            "1 for the state a host is in",
            host_state.clone(),
        );
        registry.register(
            "actions",
            "Resets, exclusions and inclusions decided",
            actions.clone(),
        );
        registry.register("decisions", "Decisions logged", decisions.clone());
        registry.register("epoch", "The epoch of each group's manager", epoch.clone());
        Arc::new(Window {
            registry: Arc::new(registry),
            host_state,
            actions,
            decisions,
            epoch,
            status: Mutex::new("{}".into()),
        })
    }

    /// Takes the central manager's state (its status JSON) for the page
    /// and the gauges.
    pub fn show(&self, status: String) {
        if let Ok(v) = serde_json::from_str::<Value>(&status) {
            for (host, h) in v["hosts"].as_object().into_iter().flatten() {
                let group = h["group"].as_str().unwrap_or("").to_string();
                for s in STATES {
                    let labels = HostLabels {
                        host: host.clone(),
                        group: group.clone(),
                        state: s.to_string(),
                    };
                    let on = h["state"].as_str() == Some(s);
                    self.host_state.get_or_create(&labels).set(i64::from(on));
                }
            }
            for g in v["groups"].as_array().into_iter().flatten() {
                let labels = GroupLabels {
                    group: g["name"].as_str().unwrap_or("").to_string(),
                };
                let e = g["epoch"].as_u64().unwrap_or(0);
                self.epoch
                    .get_or_create(&labels)
                    .set(i64::try_from(e).unwrap_or(i64::MAX));
            }
        }
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }

    fn status(&self) -> String {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The status page.
    fn page(&self) -> String {
        let v: Value = serde_json::from_str(&self.status()).unwrap_or(Value::Null);
        let mut h = String::from(
            "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"2\">\
             <title>macrolink management</title><style>body{font-family:sans-serif}\
             td,th{padding:2px 10px;text-align:left}.excluded{color:#a00}.resetting,.failed{color:#c60}\
             .suspect{color:#880}</style></head><body><h1>macrolink management</h1>\
             <table id=\"groups\"><tr><th>group</th><th>manager</th><th>epoch</th></tr>",
        );
        for g in v["groups"].as_array().into_iter().flatten() {
            h += &format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(g["name"].as_str().unwrap_or("")),
                esc(g["manager"].as_str().unwrap_or("-")),
                g["epoch"].as_u64().map_or("-".into(), |e| e.to_string())
            );
        }
        h += "</table><table id=\"hosts\"><tr><th>host</th><th>group</th><th>state</th><th>actions</th><th>why</th><th>health</th></tr>";
        for (name, r) in v["hosts"].as_object().into_iter().flatten() {
            let state = r["state"].as_str().unwrap_or("?");
            let actions: Vec<&str> = r["actions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.get(1)?.as_str())
                .collect();
            h += &format!(
                "<tr class=\"{state}\" data-host=\"{n}\"><td>{n}</td><td>{}</td><td class=\"state\">{state}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(r["group"].as_str().unwrap_or("")),
                esc(&actions.join(",")),
                esc(r["reason"].as_str().unwrap_or("")),
                esc(r["health"].as_str().unwrap_or("")),
                n = esc(name),
            );
        }
        h + "</table></body></html>"
    }

    /// Serves `listener` on a thread of its own, for as long as the
    /// process lives: `/metrics`, the page at `/`, the state at
    /// `/status.json`.
    pub fn serve(self: &Arc<Window>, listener: TcpListener) -> io::Result<()> {
        let w = self.clone();
        let pages = move |path: &str| match path {
            "/" => Some(("text/html; charset=utf-8", w.page())),
            "/status.json" => Some(("application/json", w.status())),
            _ => None,
        };
        macrolink_metrics::serve(listener, self.registry.clone(), Some(Arc::new(pages)))
    }
}

/// `s` safe inside HTML text and attributes.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn get(addr: std::net::SocketAddr, path: &str) -> String {
        macrolink_metrics::get(addr, path).unwrap()
    }

    #[test]
    fn metrics_and_page_show_the_state_and_a_silent_peer_holds_nothing_up() {
        let w = Window::new();
        w.show(
            r#"{"groups":[{"name":"m0","manager":"h1","epoch":3}],
                "hosts":{"h4":{"group":"m0","state":"excluded","actions":[[1,"reset"],[2,"exclude"]],
                "reason":"<script>x</script>","health":null}}}"#
                .into(),
        );
        w.actions
            .get_or_create(&ActionLabels {
                action: "reset".into(),
            })
            .inc();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        w.serve(l).unwrap();
        let m = get(addr, "/metrics");
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(
            m.contains(r#"macrolink_manage_host_state{host="h4",group="m0",state="excluded"} 1"#),
            "{m}"
        );
        assert!(m.contains(r#"state="healthy"} 0"#), "{m}");
        assert!(m.contains(r#"macrolink_manage_epoch{group="m0"} 3"#), "{m}");
        assert!(
            m.contains(r#"macrolink_manage_actions_total{action="reset"} 1"#),
            "{m}"
        );
        let p = get(addr, "/");
        assert!(p.contains(r#"<tr class="excluded" data-host="h4">"#), "{p}");
        assert!(
            p.contains("&lt;script&gt;") && !p.contains("<script>"),
            "{p}"
        );
        assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "POST / HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    }
}
