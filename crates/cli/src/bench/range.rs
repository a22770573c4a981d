//! `macrolink bench range`: throughput across an emulated long link, with
//! and without the relay pair, beside iperf3 (root: namespaces).

use clap::Args as ClapArgs;
use macrolink_bench::range::{self, Contender, Options};
use std::path::PathBuf;

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
    /// Also 8-byte ping-pongs through the relays and straight over the
    /// link at each distance, this many each (0: none).
    #[arg(long, default_value_t = 0)]
    latency: u32,
    /// Write the rows as JSON.
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
    let rows = range::run(&o, |r| println!("{}", range::line(r)))?;
    macrolink_bench::report::save(a.json.as_deref(), None, &rows)?;
    if let Some(p) = &a.plot {
        range::plot(p, &rows)?;
        println!("plot: {}", p.display());
    }
    if a.latency > 0 {
        println!("      km  path     median us   p99 us");
        let path = |r: &range::LatRow| if r.via_relays { "relays" } else { "direct" };
        let line = |r: &range::LatRow| {
            println!(
                "{:>8}  {:<7} {:>10.1} {:>8.1}",
                r.km,
                path(r),
                r.median_us,
                r.p99_us
            )
        };
        let lat = range::latency(&o, a.latency, line)?;
        let (pair, per_km) = range::latency_fit(&lat);
        let per_km = per_km.map_or("n.a.".into(), |k| format!("{k:.2}"));
        println!("relay pair adds {pair:.1} us (paper: 5.9 us); {per_km} us per km (fibre: 5.0)");
    }
    Ok(())
}
