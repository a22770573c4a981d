//! `macrolink link`: netem in user space, between two network namespaces.

use clap::Args as ClapArgs;
use macrolink_linkemu::{forward::emulate, forward::Emulate, Spec};
use macrolink_testbed::ready::Line;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Network namespace of end A (`-`: this process's).
    a: String,
    /// Network namespace of end B (`-`: this process's).
    b: String,
    /// What the link does, in netem's words: `delay 10ms 1ms 25% distribution
    /// normal`, `km 2`, `rate 1gbit limit 64kb`, `loss 0.1%`, `seed 7`, ...
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    spec: Vec<String>,
    /// Address of end A's device, and of end B's.
    #[arg(long, num_args = 2, default_values = ["10.77.0.1/24", "10.77.0.2/24"])]
    addr: Vec<String>,
    /// Impair A to B only; B to A is a plain wire.
    #[arg(long)]
    one_way: bool,
    /// MTU of both devices.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Counters as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let spec: Spec = a.spec.join(" ").parse().map_err(anyhow::Error::msg)?;
    let mut back = if a.one_way { Spec::new(0) } else { spec };
    back.seed ^= 1;
    let ns = |n: &str| (n != "-").then(|| n.to_string());
    let e = Emulate {
        ends: [(ns(&a.a), a.addr[0].clone()), (ns(&a.b), a.addr[1].clone())],
        a_to_b: spec,
        b_to_a: back,
        json: a.json,
        mtu: a.mtu,
    };
    let ready = |x: &str, y: &str| Line::ready().with("a", x).with("b", y).print();
    Ok(emulate(&e, ready)?)
}
