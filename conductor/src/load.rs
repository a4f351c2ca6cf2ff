//! Load estimates of one instance: what the conductor routed there, corrected by what the
//! instance reports.
//!
//! Routing needs the queue of every prefill instance and the batch of every decode instance
//! *now* and *at the time a new request would arrive*. Instances report their load, but
//! reports are periodic, late or missing, and between two reports the conductor itself knows
//! best what it sent where. So the estimate is the conductor's own bookkeeping of the work it
//! routed (each request's predicted prefill time; each request's predicted stay in a decode
//! batch), and a report, when one comes, resets the bookkeeping to the measured value from
//! which later routing continues.

/// A prefill instance's queue, as the time at which it will have finished everything routed
/// to it so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrefillLoad {
    busy_until_ms: f64,
    last_report_ms: Option<f64>,
}

impl PrefillLoad {
    /// Milliseconds new work would wait at `now_ms`.
    pub fn queue_ms(&self, now_ms: f64) -> f64 {
        (self.busy_until_ms - now_ms).max(0.0)
    }

    /// Adds routed work of `service_ms` (transfer + prefill).
    pub fn add(&mut self, now_ms: f64, service_ms: f64) {
        self.busy_until_ms = self.busy_until_ms.max(now_ms) + service_ms.max(0.0);
    }

    /// The instance measured `queued_ms` of work ahead of new requests.
    pub fn report(&mut self, now_ms: f64, queued_ms: f64) {
        self.busy_until_ms = now_ms + queued_ms.max(0.0);
        self.last_report_ms = Some(now_ms);
    }

    pub fn last_report_ms(&self) -> Option<f64> {
        self.last_report_ms
    }
}

/// Event times with running token sums, sorted: counts and sums up to any time in
/// O(log n), which the routing path asks for once per decode instance per request.
#[derive(Debug, Clone, Default, PartialEq)]
struct Timeline {
    times: Vec<f64>,
    /// `cum_tokens[i]`: tokens of events `0..=i`.
    cum_tokens: Vec<f64>,
}

impl Timeline {
    fn insert(&mut self, at_ms: f64, tokens: f64) {
        let i = self.times.partition_point(|t| *t <= at_ms);
        let before = if i > 0 { self.cum_tokens[i - 1] } else { 0.0 };
        self.times.insert(i, at_ms);
        self.cum_tokens.insert(i, before + tokens);
        for c in &mut self.cum_tokens[i + 1..] {
            *c += tokens;
        }
    }

    /// Events at or before `at_ms`, and their tokens.
    fn upto(&self, at_ms: f64) -> (f64, f64) {
        let n = self.times.partition_point(|t| *t <= at_ms);
        let tokens = if n > 0 { self.cum_tokens[n - 1] } else { 0.0 };
        (n as f64, tokens)
    }

    /// Removes the events at or before `at_ms`, returning their count and tokens.
    fn drain_upto(&mut self, at_ms: f64) -> (f64, f64) {
        let (n, tokens) = self.upto(at_ms);
        let n_usize = n as usize;
        if n_usize > 0 {
            self.times.drain(..n_usize);
            self.cum_tokens.drain(..n_usize);
            for c in &mut self.cum_tokens {
                *c -= tokens;
            }
        }
        (n, tokens)
    }
}

/// A measured decode batch.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reported {
    at_ms: f64,
    requests: f64,
    tokens: f64,
    /// The bookkeeping's own count at the time of the report: later bookkeeping changes are
    /// applied on top of the measured values as differences from this.
    booked_requests: f64,
    booked_tokens: f64,
}

/// A decode instance's batch over time: the requests routed there with their predicted
/// arrival and departure. Requests that arrived before the last [`DecodeLoad::prune`] are
/// folded into a running count; later arrivals and all pending departures are kept as
/// sorted timelines.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeLoad {
    base_ms: f64,
    /// Requests (and tokens) running at `base_ms`.
    base: (f64, f64),
    arrivals: Timeline,
    leaves: Timeline,
    report: Option<Reported>,
}

impl Default for DecodeLoad {
    fn default() -> Self {
        DecodeLoad {
            base_ms: f64::NEG_INFINITY,
            base: (0.0, 0.0),
            arrivals: Timeline::default(),
            leaves: Timeline::default(),
            report: None,
        }
    }
}

impl DecodeLoad {
    /// Records a request arriving at `arrive_ms`, leaving at `leave_ms`, holding `tokens`.
    pub fn add(&mut self, arrive_ms: f64, leave_ms: f64, tokens: f64) {
        let leave_ms = leave_ms.max(arrive_ms);
        if leave_ms <= self.base_ms {
            // Came and went before the horizon: never seen by any later query.
            return;
        }
        if arrive_ms <= self.base_ms {
            self.base.0 += 1.0;
            self.base.1 += tokens;
        } else {
            self.arrivals.insert(arrive_ms, tokens);
        }
        self.leaves.insert(leave_ms, tokens);
    }

    /// Folds everything up to `now_ms` into the running count; later queries must be for
    /// times at or after `now_ms`.
    pub fn prune(&mut self, now_ms: f64) {
        if now_ms <= self.base_ms {
            return;
        }
        let (a, at) = self.arrivals.drain_upto(now_ms);
        let (l, lt) = self.leaves.drain_upto(now_ms);
        self.base = (
            (self.base.0 + a - l).max(0.0),
            (self.base.1 + at - lt).max(0.0),
        );
        self.base_ms = now_ms;
    }

    /// Requests and tokens in the batch at `at_ms` by the bookkeeping alone (for a time
    /// before the last prune, the batch at the prune).
    fn booked(&self, at_ms: f64) -> (f64, f64) {
        let (a, at) = self.arrivals.upto(at_ms);
        let (l, lt) = self.leaves.upto(at_ms);
        (
            (self.base.0 + a - l).max(0.0),
            (self.base.1 + at - lt).max(0.0),
        )
    }

    /// The instance measured its running batch.
    pub fn report(&mut self, now_ms: f64, requests: f64, tokens: f64) {
        let (booked_requests, booked_tokens) = self.booked(now_ms);
        self.report = Some(Reported {
            at_ms: now_ms,
            requests,
            tokens,
            booked_requests,
            booked_tokens,
        });
    }

    /// Requests and tokens predicted in the batch at `at_ms`, seen from `now_ms`: the last
    /// report (if younger than `report_ttl_ms`) plus what the bookkeeping says changed
    /// since, else the bookkeeping alone.
    pub fn predicted(&self, at_ms: f64, now_ms: f64, report_ttl_ms: f64) -> (f64, f64) {
        let (r, t) = self.booked(at_ms);
        match self.report {
            Some(rep) if now_ms - rep.at_ms <= report_ttl_ms => (
                (rep.requests + r - rep.booked_requests).max(0.0),
                (rep.tokens + t - rep.booked_tokens).max(0.0),
            ),
            _ => (r, t),
        }
    }

    /// Requests known to the bookkeeping that have not left (for tests and status).
    pub fn pending(&self) -> usize {
        self.leaves.times.len()
    }

    pub fn last_report_ms(&self) -> Option<f64> {
        self.report.map(|r| r.at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_queue_drains_with_time_and_reports_reset_it() {
        let mut p = PrefillLoad::default();
        assert_eq!(p.queue_ms(0.0), 0.0);
        p.add(0.0, 100.0);
        p.add(10.0, 50.0);
        assert_eq!(p.queue_ms(10.0), 140.0);
        assert_eq!(p.queue_ms(500.0), 0.0);
        // Idle instances start new work from now, not from when they went idle.
        p.add(500.0, 10.0);
        assert_eq!(p.queue_ms(500.0), 10.0);
        // The instance says it is further behind than the conductor thought.
        p.report(500.0, 1_000.0);
        assert_eq!(p.queue_ms(600.0), 900.0);
        p.add(600.0, 100.0);
        assert_eq!(p.queue_ms(600.0), 1_000.0);
        assert_eq!(p.last_report_ms(), Some(500.0));
    }

    #[test]
    fn decode_batch_is_predicted_at_arrival_time() {
        let mut d = DecodeLoad::default();
        d.add(100.0, 1_000.0, 10.0);
        d.add(500.0, 2_000.0, 20.0);
        assert_eq!(d.predicted(0.0, 0.0, 1e9), (0.0, 0.0));
        assert_eq!(d.predicted(600.0, 0.0, 1e9), (2.0, 30.0));
        assert_eq!(d.predicted(1_500.0, 0.0, 1e9), (1.0, 20.0));
        d.prune(1_200.0);
        assert_eq!(d.predicted(1_200.0, 1_200.0, 1e9), (1.0, 20.0));
        assert_eq!(d.predicted(2_500.0, 1_200.0, 1e9), (0.0, 0.0));
        assert_eq!(d.pending(), 1);
        // Arrivals before the horizon count as running; ones already gone are dropped.
        d.add(1_000.0, 1_500.0, 5.0);
        d.add(1_000.0, 1_100.0, 7.0);
        assert_eq!(d.predicted(1_200.0, 1_200.0, 1e9), (2.0, 25.0));
        assert_eq!(d.predicted(1_600.0, 1_200.0, 1e9), (1.0, 20.0));
    }

    #[test]
    fn many_out_of_order_stays_sum_like_a_scan() {
        let mut d = DecodeLoad::default();
        let mut stays = Vec::new();
        let mut x = 7u64;
        for _ in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let arrive = (x >> 40) as f64 % 10_000.0;
            let leave = arrive + (x >> 20) as f64 % 3_000.0;
            let tokens = (x % 97) as f64;
            d.add(arrive, leave, tokens);
            stays.push((arrive, leave, tokens));
        }
        d.prune(4_000.0);
        for at in [4_000.0, 5_123.0, 9_999.0, 20_000.0] {
            let scan = stays
                .iter()
                .filter(|(a, l, _)| *a <= at && at < *l)
                .fold((0.0, 0.0), |(r, t), s| (r + 1.0, t + s.2));
            assert_eq!(d.predicted(at, 4_000.0, 0.0), scan, "at {at}");
        }
    }

    #[test]
    fn reports_override_bookkeeping_until_they_age() {
        let mut d = DecodeLoad::default();
        d.add(0.0, 1_000.0, 10.0);
        // The instance runs 5 requests the conductor did not route (another router).
        d.report(100.0, 5.0, 500.0);
        assert_eq!(d.predicted(100.0, 100.0, 1_000.0), (5.0, 500.0));
        // When the routed request leaves, the measured batch shrinks by it.
        assert_eq!(d.predicted(1_000.0, 200.0, 1_000.0), (4.0, 490.0));
        // A new routed arrival adds to the measured batch.
        d.add(300.0, 5_000.0, 7.0);
        assert_eq!(d.predicted(400.0, 300.0, 1_000.0), (6.0, 507.0));
        // Too old: bookkeeping alone.
        assert_eq!(d.predicted(400.0, 5_000.0, 1_000.0), (2.0, 17.0));
    }
}
