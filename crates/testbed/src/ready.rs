//! The lines a macrolink process prints on standard output to tell the
//! process that started it where it is: a `region` line per registered
//! region, then one `ready` line once it serves.
//!
//! ```text
//! region ep=1 key=0x1f2e3d4c5b6a7988 bytes=4194304
//! ready node=2 tcp=127.0.0.1:40123
//! ```
//!
//! A line is a word and then `key=value` fields, or bare words (flags).
//! Values hold no white space.

use std::fmt;
use std::io::Write;
use std::str::FromStr;

/// One such line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    word: String,
    fields: Vec<(String, Option<String>)>,
}

impl Line {
    /// A line that starts with `word`.
    pub fn new(word: &str) -> Line {
        Line {
            word: word.to_string(),
            fields: Vec::new(),
        }
    }

    /// The `ready` line.
    pub fn ready() -> Line {
        Line::new("ready")
    }

    /// The `ready` line of a fabric node: its id and TCP address.
    pub fn node(id: u32, tcp: Option<std::net::SocketAddr>) -> Line {
        Line::ready()
            .with("node", id)
            .with("tcp", tcp.map(|a| a.to_string()).unwrap_or_default())
    }

    /// A `region` line.
    pub fn region() -> Line {
        Line::new("region")
    }

    /// Adds `key=value`.
    pub fn with(mut self, key: &str, value: impl fmt::Display) -> Line {
        self.fields.push((key.to_string(), Some(value.to_string())));
        self
    }

    /// Adds `key=value` when there is a value.
    pub fn with_some(self, key: &str, value: Option<impl fmt::Display>) -> Line {
        match value {
            Some(v) => self.with(key, v),
            None => self,
        }
    }

    /// Adds a bare word when `on`.
    pub fn flag(mut self, word: &str, on: bool) -> Line {
        if on {
            self.fields.push((word.to_string(), None));
        }
        self
    }

    /// Prints it on standard output and flushes, so a parent reading a
    /// pipe sees it at once.
    pub fn print(&self) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{self}")?;
        out.flush()
    }

    /// Reads a line; `None` when it has no word.
    pub fn parse(text: &str) -> Option<Line> {
        let mut words = text.split_whitespace();
        let word = words.next()?.to_string();
        let fields = words
            .map(|w| match w.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (w.to_string(), None),
            })
            .collect();
        Some(Line { word, fields })
    }

    /// Its first word.
    pub fn word(&self) -> &str {
        &self.word
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Whether it carries the bare word `word`.
    pub fn has(&self, word: &str) -> bool {
        self.fields.iter().any(|(k, v)| k == word && v.is_none())
    }

    /// The value of `key`, parsed; an error that names the key and the line
    /// when it is missing or malformed.
    pub fn value<T: FromStr>(&self, key: &str) -> anyhow::Result<T>
    where
        T::Err: fmt::Display,
    {
        let v = self
            .get(key)
            .ok_or_else(|| anyhow::anyhow!("no {key}= in {self:?}"))?;
        v.parse()
            .map_err(|e| anyhow::anyhow!("{key}={v} in {self}: {e}"))
    }

    /// The value of `key`, parsed, when present.
    pub fn value_opt<T: FromStr>(&self, key: &str) -> anyhow::Result<Option<T>>
    where
        T::Err: fmt::Display,
    {
        match self.get(key) {
            Some(_) => self.value(key).map(Some),
            None => Ok(None),
        }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.word)?;
        for (k, v) in &self.fields {
            match v {
                Some(v) => write!(f, " {k}={v}")?,
                None => write!(f, " {k}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn a_printed_line_parses_back() {
        let addr: SocketAddr = "127.0.0.1:7130".parse().unwrap();
        let l = Line::ready()
            .with("tcp", addr)
            .with("url", format!("ml://{addr}/"))
            .flag("read-only", true)
            .flag("verbose", false)
            .with_some("fabric", None::<SocketAddr>);
        assert_eq!(
            l.to_string(),
            "ready tcp=127.0.0.1:7130 url=ml://127.0.0.1:7130/ read-only"
        );
        let back = Line::parse(&l.to_string()).unwrap();
        assert_eq!(back, l);
        assert_eq!(back.word(), "ready");
        assert_eq!(back.value::<SocketAddr>("tcp").unwrap(), addr);
        assert!(back.has("read-only") && !back.has("tcp"));
        assert_eq!(back.value_opt::<SocketAddr>("fabric").unwrap(), None);
        assert!(back
            .value::<u32>("tcp")
            .unwrap_err()
            .to_string()
            .contains("tcp="));
        assert!(back.value::<u32>("node").is_err());
        assert_eq!(Line::parse("   "), None);
    }
}
