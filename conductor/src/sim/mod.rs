//! The trace simulator: replays a Mooncake-format trace through the real routing code
//! against simulated prefill and decode instances, for every policy.
//!
//! Policies are independent simulations over the same trace (read once), so they run on
//! parallel threads; each is single-threaded and deterministic (the random policy is seeded).

pub mod cache;
pub mod chart;
pub mod engine;
pub mod report;
pub mod trace;

pub use cache::Eviction;
pub use engine::{run_policy, PolicyRun, SimConfig};
pub use report::{PolicySummary, SimReport};
pub use trace::{Trace, TraceError};

use crate::policy::Policy;

/// Runs `policies` over `trace` (in parallel) and reports them in the order given.
pub fn simulate(trace: &Trace, cfg: &SimConfig, policies: &[Policy]) -> SimReport {
    let runs: Vec<PolicyRun> = std::thread::scope(|scope| {
        let handles: Vec<_> = policies
            .iter()
            .map(|p| scope.spawn(move || run_policy(trace, cfg, *p)))
            .collect();
        handles
            .into_iter()
            .zip(policies)
            .map(|(h, p)| {
                // A panicking simulation is a bug; rerun it on this thread so the panic
                // surfaces with its message instead of a generic join error.
                h.join().unwrap_or_else(|_| run_policy(trace, cfg, *p))
            })
            .collect()
    });
    report::build(trace, cfg, &runs)
}
