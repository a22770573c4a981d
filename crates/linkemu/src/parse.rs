//! A link spec in words, as `tc qdisc ... netem` takes them, so that anyone
//! who knows netem can use `macrolink link` without learning anything new:
//!
//! ```text
//! delay TIME [JITTER [CORRELATION%]] [distribution uniform|normal|pareto]
//! km KILOMETRES                       (5 us of delay per km of fibre)
//! rate RATE [burst BYTES] [limit BYTES | queue TIME]
//! loss [random] P% | loss gemodel P [R [1-H [1-K]]]
//! reorder P%   duplicate P%   corrupt P%   seed N
//! ```
//!
//! Times take `s`, `ms`, `us`, `ns`; rates `bit`, `kbit`, `mbit`, `gbit`
//! (bits per second) or `bps`, `kbps`, `mbps`, `gbps` (bytes per second,
//! as tc has them); sizes `b`, `kb`/`k`, `mb`/`m`, `kib`, `mib`;
//! probabilities a percentage or a fraction.

use crate::jitter::{Distribution, Jitter};
use crate::loss::LossModel;
use crate::spec::{QueueLimit, Rate, Spec, NS_PER_KM};
use crate::Nanos;

/// The queue in front of a rate limit when the spec names none.
pub const DEFAULT_QUEUE: QueueLimit = QueueLimit::Time(100_000_000);

impl std::str::FromStr for Spec {
    type Err = String;

    /// A spec from its words (see the module's documentation).
    fn from_str(s: &str) -> Result<Spec, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let mut w = Words { w: &words, at: 0 };
        let mut spec = Spec::new(0);
        while let Some(word) = w.next() {
            match word {
                "delay" => {
                    spec.delay = time(w.need("delay")?)?;
                    if let Some(j) = w.peek_with(time) {
                        w.at += 1;
                        let correlation = match w.peek_with(prob) {
                            Some(c) => {
                                w.at += 1;
                                c
                            }
                            None => 0.0,
                        };
                        spec.jitter = Some(Jitter {
                            amount: j,
                            distribution: Distribution::Uniform,
                            correlation,
                        });
                    }
                    if w.peek() == Some("distribution") {
                        w.at += 1;
                        let d = match w.need("distribution")? {
                            "uniform" => Distribution::Uniform,
                            "normal" => Distribution::Normal,
                            "pareto" => Distribution::Pareto,
                            other => return Err(format!("no distribution {other:?}")),
                        };
                        let j = spec
                            .jitter
                            .as_mut()
                            .ok_or("a distribution needs a jitter")?;
                        j.distribution = d;
                    }
                }
                "km" => {
                    let km: f64 = num(w.need("km")?)?;
                    spec.delay = (km * NS_PER_KM as f64).round() as Nanos;
                }
                "rate" => {
                    let mut r = Rate {
                        bytes_per_sec: rate(w.need("rate")?)?,
                        burst: 0,
                        queue: DEFAULT_QUEUE,
                    };
                    loop {
                        match w.peek() {
                            Some("burst") => r.burst = size(w.after("burst")?)?,
                            Some("limit") => r.queue = QueueLimit::Bytes(size(w.after("limit")?)?),
                            Some("queue") => r.queue = QueueLimit::Time(time(w.after("queue")?)?),
                            _ => break,
                        }
                    }
                    spec.rate = Some(r);
                }
                "loss" => {
                    spec.loss = match w.need("loss")? {
                        "gemodel" => {
                            let p = prob(w.need("gemodel")?)?;
                            let mut more = [1.0 - p, 1.0, 0.0];
                            for m in more.iter_mut() {
                                match w.peek_with(prob) {
                                    Some(v) => {
                                        *m = v;
                                        w.at += 1;
                                    }
                                    None => break,
                                }
                            }
                            LossModel::GilbertElliott {
                                p,
                                r: more[0],
                                loss_bad: more[1],
                                loss_good: more[2],
                            }
                        }
                        "random" => LossModel::Bernoulli {
                            p: prob(w.need("random")?)?,
                        },
                        p => LossModel::Bernoulli { p: prob(p)? },
                    }
                }
                "reorder" => spec.reorder = prob(w.need("reorder")?)?,
                "duplicate" => spec.duplicate = prob(w.need("duplicate")?)?,
                "corrupt" => spec.corrupt = prob(w.need("corrupt")?)?,
                "seed" => spec.seed = num(w.need("seed")?)?,
                other => return Err(format!("unknown word {other:?}")),
            }
        }
        spec.check()?;
        Ok(spec)
    }
}

struct Words<'a> {
    w: &'a [&'a str],
    at: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let x = self.w.get(self.at).copied();
        self.at += 1;
        x
    }
    fn peek(&self) -> Option<&'a str> {
        self.w.get(self.at).copied()
    }
    /// The next word, if `f` reads it.
    fn peek_with<T>(&self, f: fn(&str) -> Result<T, String>) -> Option<T> {
        self.peek().and_then(|x| f(x).ok())
    }
    fn need(&mut self, after: &str) -> Result<&'a str, String> {
        self.next()
            .ok_or_else(|| format!("{after:?} needs a value"))
    }
    /// Skips `keyword` and returns its value.
    fn after(&mut self, keyword: &str) -> Result<&'a str, String> {
        self.at += 1;
        self.need(keyword)
    }
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{s:?} is not a number"))
}

/// Splits "10ms" into 10.0 and "ms".
fn split(s: &str) -> Result<(f64, String), String> {
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (n, unit) = s.split_at(at);
    let v: f64 = num(n)?;
    if !v.is_finite() {
        return Err(format!("{s:?} is not a number"));
    }
    Ok((v, unit.to_ascii_lowercase()))
}

fn time(s: &str) -> Result<Nanos, String> {
    let (v, unit) = split(s)?;
    let ns = match unit.as_str() {
        "s" | "sec" => 1e9,
        "ms" | "msec" => 1e6,
        "us" | "usec" => 1e3,
        "ns" | "nsec" => 1.0,
        "" if v == 0.0 => 0.0,
        _ => return Err(format!("{s:?} is not a time (10ms, 200us, 1s)")),
    };
    Ok((v * ns).round() as Nanos)
}

fn rate(s: &str) -> Result<u64, String> {
    let (v, unit) = split(s)?;
    let bytes = match unit.as_str() {
        "bit" => v / 8.0,
        "kbit" => v * 1e3 / 8.0,
        "mbit" => v * 1e6 / 8.0,
        "gbit" => v * 1e9 / 8.0,
        "bps" => v,
        "kbps" => v * 1e3,
        "mbps" => v * 1e6,
        "gbps" => v * 1e9,
        _ => return Err(format!("{s:?} is not a rate (1gbit, 100mbit, 125mbps)")),
    };
    if bytes < 1.0 {
        return Err(format!("{s:?} is less than a byte per second"));
    }
    Ok(bytes.round() as u64)
}

fn size(s: &str) -> Result<u64, String> {
    let (v, unit) = split(s)?;
    let b = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        _ => return Err(format!("{s:?} is not a size (1500, 64kb, 1mib)")),
    };
    Ok((v * b).round() as u64)
}

fn prob(s: &str) -> Result<f64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => num::<f64>(p)? / 100.0,
        None => num::<f64>(s)?,
    };
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?} is not a probability"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netem_words_read_as_they_do_in_tc() {
        let s: Spec = "delay 10ms 1ms 25% distribution normal rate 1gbit limit 64kb loss 0.1% reorder 1% duplicate 0.5% corrupt 0.01% seed 7"
            .parse()
            .unwrap();
        assert_eq!(s.delay, 10_000_000);
        let j = s.jitter.unwrap();
        assert_eq!(
            (j.amount, j.distribution),
            (1_000_000, Distribution::Normal)
        );
        assert!((j.correlation - 0.25).abs() < 1e-12);
        let r = s.rate.unwrap();
        assert_eq!(
            (r.bytes_per_sec, r.queue),
            (125_000_000, QueueLimit::Bytes(64_000))
        );
        assert_eq!(s.loss, LossModel::Bernoulli { p: 0.001 });
        assert!((s.reorder - 0.01).abs() < 1e-12 && (s.duplicate - 0.005).abs() < 1e-12);
        assert_eq!(s.seed, 7);
        let s: Spec = "km 2 rate 125mbps queue 5ms loss gemodel 1% 30%"
            .parse()
            .unwrap();
        assert_eq!(s.delay, 10_000);
        assert_eq!(s.rate.unwrap().queue, QueueLimit::Time(5_000_000));
        assert_eq!(
            s.loss,
            LossModel::GilbertElliott {
                p: 0.01,
                r: 0.3,
                loss_bad: 1.0,
                loss_good: 0.0
            }
        );
        assert_eq!("".parse::<Spec>().unwrap(), Spec::new(0));
        for bad in [
            "delay",
            "delay ten",
            "delay 10",
            "rate 10",
            "rate 0bit",
            "loss 120%",
            "reorder -1%",
            "delay 1ms distribution normal",
            "delay 1ms 1ms distribution odd",
            "nonsense 1",
            "loss gemodel",
            "delay infms",
        ] {
            assert!(bad.parse::<Spec>().is_err(), "{bad:?} was taken");
        }
    }
}
