// Temporary profiling harness (not part of the deliverable).
use hpmoe_dsl::check::{check_path, Options, Override};
use hpmoe_dsl::lower::{self, DEFAULT_MAX_TASKS};
use hpmoe_dsl::schedule::{self, Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::model::DeviceModel;
use hpmoe_sim::sim::{simulate, SimOptions, Workload};
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let file = &a[1];
    let ranks: u32 = a[2].parse().unwrap();
    let policy = Policy::parse(&a[3]).unwrap();
    let reps: usize = a.get(4).map_or(3, |x| x.parse().unwrap());
    let opts = Options { overrides: vec![Override::parse(&format!("ranks={ranks}")).unwrap()], ..Options::default() };
    let p = check_path(std::path::Path::new(file), &opts, &mut SourceMap::new()).program.unwrap();
    let spec = PolicySpec::new(policy);
    let layouts = lower::layouts(&p, spec.static_capacity, None).unwrap();
    let c = schedule::compile(&p, &p.taskflows[0], &spec, layouts, DEFAULT_MAX_TASKS, false).unwrap();
    let m = DeviceModel::new(&p.device).unwrap();
    let t0 = std::time::Instant::now();
    let w = Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
    eprintln!("prepare {:?}; read entries {}, blocks {}, flows {}, pairs {}", t0.elapsed(), w.plan.run_first.len(), w.blocks(), w.flows(), w.pairs.len());
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = std::time::Instant::now();
        let r = simulate(&w, &c.schedule, &m, SimOptions::default()).unwrap();
        let dt = t0.elapsed();
        best = best.min(dt.as_secs_f64());
        eprintln!("simulate {:?}: {} tasks, {} events, {:.2} Mtasks/s, makespan {:.1} us", dt, c.graph.len(), r.events, c.graph.len() as f64 / dt.as_secs_f64() / 1e6, r.makespan * 1e6);
    }
    println!("{} EP{} {}: {} tasks, best {:.1} ms = {:.2} Mtasks/s", file, ranks, a[3], c.graph.len(), best * 1e3, c.graph.len() as f64 / best / 1e6);
}
