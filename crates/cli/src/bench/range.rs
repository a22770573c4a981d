//! `macrolink bench range`: throughput across an emulated long link, with
//! and without the relay pair, beside iperf3; latency of the IMB patterns;
//! the emulator's own accuracy (root: namespaces).

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_bench::range::{self, AccRow, Contender, LatFit, LatRow, Options, Row};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Distances, km of fibre (5 us each way per km).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.003,0.69,2,10,100,1000,14000"
    )]
    km: Vec<f64>,
    /// Streams of each contender.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    streams: Vec<u32>,
    /// Rate of the link, in `macrolink link`'s words.
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// Loss rates of the link (`0.1%`; `gemodel 1% 10%` for bursts).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    loss: Vec<String>,
    /// Also run the relays with these windows, KiB (the paper's figure of
    /// throughput against buffer size).
    #[arg(long, value_delimiter = ',')]
    window_kib: Vec<u64>,
    /// Who runs: relays, direct, cubic, bbr.
    #[arg(long, value_delimiter = ',', default_value = "relays,direct,cubic,bbr")]
    contenders: Vec<Contender>,
    /// Seconds per figure.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// MTU of the link's devices.
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// Also the IMB patterns (PingPong, PingPing, SendRecv, Exchange) of
    /// 8-byte messages through the relays and straight over the link at
    /// each distance, this many iterations each (0: none).
    #[arg(long, default_value_t = 0)]
    latency: u32,
    /// Also check the link emulator against what it is asked: delay, rate
    /// and loss, measured across it.
    #[arg(long)]
    accuracy: bool,
    /// Write the rows as JSON: an object with `throughput`, `latency`,
    /// `latency_fit` and `accuracy`, each a list of rows.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw throughput against distance as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let o = Options {
        exe: std::env::current_exe()?,
        windows: std::iter::once(None)
            .chain(a.window_kib.into_iter().map(Some))
            .collect(),
        km: a.km,
        streams: a.streams,
        rate: a.rate,
        loss: a.loss,
        contenders: a.contenders,
        seconds: a.seconds,
        mtu: a.mtu,
    };
    eprintln!("bench range: about {:?}", range::estimate(&o));
    println!("{}", range::HEADER);
    let mut all = Saved {
        throughput: range::run(&o, |r| println!("{}", range::line(r)))?,
        ..Saved::default()
    };
    all.save(a.json.as_deref())?;
    if let Some(p) = &a.plot {
        range::plot(p, &all.throughput)?;
        println!("plot: {}", p.display());
    }
    if a.latency > 0 {
        println!("\n{}", range::LAT_HEADER);
        all.latency = range::latency(&o, a.latency, |r| println!("{}", range::lat_line(r)))?;
        all.latency_fit = range::latency_fit(&all.latency);
        println!("\n{}", range::FIT_HEADER);
        for f in &all.latency_fit {
            println!("{}", range::fit_line(f));
        }
        println!("{}", range::paper_line());
        all.save(a.json.as_deref())?;
    }
    if a.accuracy {
        println!("\n{}", range::ACC_HEADER);
        all.accuracy = range::accuracy(&o, |r| println!("{}", range::acc_line(r)))?;
        all.save(a.json.as_deref())?;
    }
    let failed = all.throughput.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        anyhow::bail!("{failed} throughput figure(s) failed; their rows say why");
    }
    Ok(())
}

/// What `--json` holds: every kind of row of the run.
#[derive(Debug, Default, Serialize)]
struct Saved {
    throughput: Vec<Row>,
    latency: Vec<LatRow>,
    latency_fit: Vec<LatFit>,
    accuracy: Vec<AccRow>,
}

impl Saved {
    /// Writes what there is so far to `path`, if asked, so that a run
    /// that fails later keeps what it measured.
    fn save(&self, path: Option<&Path>) -> anyhow::Result<()> {
        let Some(p) = path else {
            return Ok(());
        };
        let json = serde_json::to_vec_pretty(self)?;
        std::fs::write(p, json).with_context(|| p.display().to_string())
    }
}
