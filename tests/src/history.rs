//! A recorded history of client operations on a key-value register per key (PUT of a unique
//! value, GET, DELETE) and a checker that judges it, Jepsen style, against the state every
//! owner holds once the cluster is quiet.
//!
//! Each operation has an invocation time, a completion time and an outcome:
//! - ok: acknowledged (2xx; a GET also says what it read, a value or "absent");
//! - failed: definitely not applied (a 4xx, or a connection that was refused, so nothing was
//!   sent);
//! - unknown: may or may not have been applied (a 5xx, a timeout, a connection cut mid-way).
//!   Its completion time counts as infinite: it may take effect at any later moment.
//!
//! Values are unique per write, so a value read or held names the one write that produced it.
//! The checker only uses real-time order: operation A *follows* W when A was invoked after W
//! completed. Nothing finer (no linearizability search) is needed for the anomalies below, so
//! every anomaly it reports is a real one, whatever the order of concurrent operations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A value written: unique in a history.
pub type Value = String;

/// What an operation asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Put(Value),
    Get,
    Delete,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged. For a GET, what it read (`None`: the key is absent).
    Ok(Option<Value>),
    /// Definitely not applied; why (the status, or the transport error).
    Failed(String),
    /// Perhaps applied, perhaps not; why.
    Unknown(String),
}

/// One operation of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Position in the history (set by [`Recorder::record`]).
    pub id: usize,
    /// The client (thread) that ran it.
    pub client: usize,
    /// The node it was sent to.
    pub node: usize,
    pub key: String,
    pub kind: OpKind,
    /// When it was sent and when its answer (or error) came, from the history's start.
    pub invoke: Duration,
    pub complete: Duration,
    pub outcome: Outcome,
}

impl Op {
    /// Acknowledged.
    pub fn acked(&self) -> bool {
        matches!(self.outcome, Outcome::Ok(_))
    }

    /// Acknowledged or unknown: it may be part of the state.
    pub fn may_have_applied(&self) -> bool {
        !matches!(self.outcome, Outcome::Failed(_))
    }

    /// When its effect was certainly over: its completion if acknowledged or failed, never
    /// (`None`) if unknown.
    pub fn done_by(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::Unknown(_) => None,
            _ => Some(self.complete),
        }
    }

    /// Whether it completed (for certain) before `t`: an unknown operation never does.
    pub fn completed_before(&self, t: Duration) -> bool {
        self.done_by().is_some_and(|c| c < t)
    }

    fn is_write(&self) -> bool {
        matches!(self.kind, OpKind::Put(_) | OpKind::Delete)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.kind {
            OpKind::Put(v) => format!("PUT {}={v}", self.key),
            OpKind::Get => format!("GET {}", self.key),
            OpKind::Delete => format!("DELETE {}", self.key),
        };
        let outcome = match &self.outcome {
            Outcome::Ok(_) if self.kind == OpKind::Get => {
                format!("read {}", shown(&self.read_value()))
            }
            Outcome::Ok(_) => "ok".to_string(),
            Outcome::Failed(why) => format!("failed ({why})"),
            Outcome::Unknown(why) => format!("unknown ({why})"),
        };
        write!(
            f,
            "#{} c{} via node{} {what} [{:.3}s..{:.3}s] {outcome}",
            self.id,
            self.client,
            self.node,
            self.invoke.as_secs_f64(),
            self.complete.as_secs_f64()
        )
    }
}

impl Op {
    /// What an acknowledged GET read (`None` for absent or for any other operation).
    fn read_value(&self) -> Option<Value> {
        match &self.outcome {
            Outcome::Ok(v) => v.clone(),
            _ => None,
        }
    }
}

fn shown(v: &Option<Value>) -> String {
    v.clone().unwrap_or_else(|| "absent".into())
}

/// Collects operations from many client threads, timed from one start.
pub struct Recorder {
    start: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Time since the history started.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Adds a completed operation (its `id` is assigned here).
    pub fn record(&self, mut op: Op) {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        op.id = ops.len();
        ops.push(op);
    }

    /// Operations recorded so far.
    pub fn len(&self) -> usize {
        self.ops.lock().map(|o| o.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn into_history(self) -> Vec<Op> {
        self.ops.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// What one node holds of a key once the cluster is quiet, read from that node alone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    Value(Value),
    Absent,
    /// The node could not be read; why.
    Unreadable(String),
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Held::Value(v) => write!(f, "{v}"),
            Held::Absent => write!(f, "absent"),
            Held::Unreadable(why) => write!(f, "unreadable ({why})"),
        }
    }
}

/// A key's final state: what each of its owners holds (by node name), and what other nodes
/// still hold (stray copies, which only rebalancing would serve; reported, not judged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    /// The bucket's replica count (capped by the members, as placement caps it).
    pub replicas: usize,
    pub owners: Vec<(String, Held)>,
    pub others: Vec<(String, Held)>,
}

impl KeyState {
    /// Every owner holds the same state, and all of them hold it if it exists: what repair
    /// converges to (a state may still be wrong; [`check`] says).
    pub fn converged(&self) -> bool {
        let mut held = self.owners.iter().map(|(_, h)| h);
        let Some(first) = held.next() else {
            return true;
        };
        !matches!(first, Held::Unreadable(_)) && held.all(|h| h == first)
    }
}

/// The kinds of anomaly the checker reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AnomalyKind {
    /// An owner's final state is explained only by operations that an acknowledged write (or
    /// an acknowledged delete, for a final "absent") followed: that write is lost.
    LostWrite,
    /// An owner's final value was written before an acknowledged delete was invoked.
    ResurrectedDelete,
    /// The owners of a key hold different states.
    Divergent,
    /// A key that exists is held by fewer owners than the bucket's replica count.
    UnderReplicated,
    /// A GET invoked more than the bound after an acknowledged write or delete completed read
    /// a state that operation had replaced.
    StaleRead,
    /// A value no write explains: never written, written by a write that definitely failed,
    /// or read before its write was invoked.
    Phantom,
    /// An owner could not be read after quiescence.
    Unreadable,
}

impl AnomalyKind {
    pub const ALL: [AnomalyKind; 7] = [
        AnomalyKind::LostWrite,
        AnomalyKind::ResurrectedDelete,
        AnomalyKind::Divergent,
        AnomalyKind::UnderReplicated,
        AnomalyKind::StaleRead,
        AnomalyKind::Phantom,
        AnomalyKind::Unreadable,
    ];

    /// Its name in summaries.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "lost",
            AnomalyKind::ResurrectedDelete => "resurrected",
            AnomalyKind::Divergent => "divergent",
            AnomalyKind::UnderReplicated => "under_replicated",
            AnomalyKind::StaleRead => "stale",
            AnomalyKind::Phantom => "phantom",
            AnomalyKind::Unreadable => "unreadable",
        }
    }
}

/// One anomaly: its kind, the key, and the operations and holders that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub key: String,
    pub detail: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.kind.name(), self.key, self.detail)
    }
}

/// Writes listed per key when a failure is explained.
const HISTORY_LINES: usize = 30;

/// What the checker found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub ops: usize,
    pub acked: usize,
    pub failed: usize,
    pub unknown: usize,
    /// The stale-read bound the reads were judged with.
    pub stale_bound: Duration,
    pub anomalies: Vec<Anomaly>,
    /// Copies held by nodes that do not own the key (not an anomaly by itself).
    pub strays: usize,
}

impl Report {
    pub fn count(&self, kind: AnomalyKind) -> usize {
        self.anomalies.iter().filter(|a| a.kind == kind).count()
    }

    /// Keys with an anomaly of `kind`.
    pub fn keys(&self, kind: AnomalyKind) -> BTreeSet<&str> {
        self.anomalies
            .iter()
            .filter(|a| a.kind == kind)
            .map(|a| a.key.as_str())
            .collect()
    }

    /// The counts as one JSON object, for a summary line; `head` (JSON members, e.g.
    /// `"scenario":"x"`) comes first.
    pub fn summary(&self, head: &str) -> String {
        let mut fields: Vec<String> = Vec::new();
        if !head.is_empty() {
            fields.push(head.to_string());
        }
        for (name, n) in [
            ("ops", self.ops),
            ("acked", self.acked),
            ("failed", self.failed),
            ("unknown", self.unknown),
        ] {
            fields.push(format!("\"{name}\":{n}"));
        }
        for kind in AnomalyKind::ALL {
            fields.push(format!("\"{}\":{}", kind.name(), self.count(kind)));
        }
        fields.push(format!(
            "\"stale_bound_ms\":{},\"strays\":{}",
            self.stale_bound.as_millis(),
            self.strays
        ));
        format!("{{{}}}", fields.join(","))
    }

    /// The anomalies of the given kinds, at most `limit` of them, one a line, with the
    /// history of the first keys involved: what a failing test prints.
    pub fn explain(&self, kinds: &[AnomalyKind], history: &[Op], limit: usize) -> String {
        let chosen: Vec<&Anomaly> = self
            .anomalies
            .iter()
            .filter(|a| kinds.contains(&a.kind))
            .collect();
        let mut out = String::new();
        for a in chosen.iter().take(limit) {
            out.push_str(&format!("  {a}\n"));
        }
        if chosen.len() > limit {
            out.push_str(&format!("  ... and {} more\n", chosen.len() - limit));
        }
        let keys: BTreeSet<&str> = chosen.iter().map(|a| a.key.as_str()).collect();
        // Without a history (a caller that wants the list alone), no key's writes.
        let keys_shown = if history.is_empty() { 0 } else { 3 };
        for key in keys.iter().take(keys_shown) {
            let writes: Vec<&Op> = history
                .iter()
                .filter(|o| o.key == *key && o.is_write() && o.may_have_applied())
                .collect();
            let shown = writes.len().min(HISTORY_LINES);
            out.push_str(&format!(
                "last {shown} of the {} writes of {key} that may have applied:\n",
                writes.len()
            ));
            for op in &writes[writes.len() - shown..] {
                out.push_str(&format!("    {op}\n"));
            }
        }
        out
    }
}

/// Judges `history` against `finals` (each key's state after quiescence); GETs are judged
/// with `stale_bound`. Keys in the history but not in `finals` are judged on reads only.
pub fn check(history: &[Op], finals: &BTreeMap<String, KeyState>, stale_bound: Duration) -> Report {
    let mut report = Report {
        ops: history.len(),
        acked: history.iter().filter(|o| o.acked()).count(),
        failed: history
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Failed(_)))
            .count(),
        unknown: history
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Unknown(_)))
            .count(),
        stale_bound,
        ..Report::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    for key in finals.keys() {
        by_key.entry(key.as_str()).or_default();
    }
    for (key, ops) in &by_key {
        let ops = KeyOps::new(ops);
        check_reads(key, &ops, stale_bound, &mut report.anomalies);
        if let Some(state) = finals.get(*key) {
            check_final(key, &ops, state, &mut report.anomalies);
            report.strays += state
                .others
                .iter()
                .filter(|(_, h)| matches!(h, Held::Value(_)))
                .count();
        }
    }
    report
}

/// One key's operations, with its writes by value.
struct KeyOps<'a> {
    ops: &'a [&'a Op],
    puts: BTreeMap<&'a str, &'a Op>,
}

impl<'a> KeyOps<'a> {
    fn new(ops: &'a [&'a Op]) -> KeyOps<'a> {
        let puts = ops
            .iter()
            .filter_map(|o| match &o.kind {
                OpKind::Put(v) => Some((v.as_str(), *o)),
                _ => None,
            })
            .collect();
        KeyOps { ops, puts }
    }

    /// Acknowledged writes and deletes invoked after `t`, but `except`.
    fn acked_writes_after(&self, t: Duration, except: usize) -> impl Iterator<Item = &'a Op> + '_ {
        self.ops
            .iter()
            .copied()
            .filter(move |o| o.is_write() && o.acked() && o.id != except && o.invoke > t)
    }

    /// The write that produced `v`, or why none explains it.
    fn writer(&self, v: &str) -> Result<&'a Op, String> {
        match self.puts.get(v) {
            None => Err(format!("{v} was never written")),
            Some(w) if !w.may_have_applied() => Err(format!("{v} comes from a failed write: {w}")),
            Some(w) => Ok(w),
        }
    }

    /// Whether "absent" is explained when last observed at `upto` (a read's completion, or
    /// never for the final state): some delete that may have applied, not certainly over
    /// before an acknowledged write was invoked, was invoked before `upto`. With no
    /// acknowledged write, "absent" is the initial state. Returns the acknowledged write that
    /// no delete explains away otherwise.
    fn absent_unexplained(&self, upto: Option<Duration>) -> Option<&'a Op> {
        let acked_puts: Vec<&Op> = self
            .ops
            .iter()
            .copied()
            .filter(|o| matches!(o.kind, OpKind::Put(_)) && o.acked())
            .filter(|o| upto.is_none_or(|u| o.complete < u))
            .collect();
        let last = acked_puts.iter().max_by_key(|o| o.invoke)?;
        let explained = self.ops.iter().any(|d| {
            d.kind == OpKind::Delete
                && d.may_have_applied()
                && upto.is_none_or(|u| d.invoke < u)
                && !acked_puts.iter().any(|w| d.completed_before(w.invoke))
        });
        (!explained).then_some(*last)
    }
}

fn held_by(holders: &[(String, Held)], held: &Held) -> String {
    holders
        .iter()
        .filter(|(_, h)| h == held)
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn check_final(key: &str, ops: &KeyOps, state: &KeyState, out: &mut Vec<Anomaly>) {
    let mut push = |kind, detail| {
        out.push(Anomaly {
            kind,
            key: key.to_string(),
            detail,
        })
    };
    for (node, held) in &state.owners {
        if let Held::Unreadable(why) = held {
            push(AnomalyKind::Unreadable, format!("{node}: {why}"));
        }
    }
    let distinct: BTreeSet<&Held> = state
        .owners
        .iter()
        .map(|(_, h)| h)
        .filter(|h| !matches!(h, Held::Unreadable(_)))
        .collect();
    if distinct.len() > 1 {
        let each: Vec<String> = state
            .owners
            .iter()
            .map(|(n, h)| format!("{n}={h}"))
            .collect();
        push(
            AnomalyKind::Divergent,
            format!("owners hold {}", each.join(", ")),
        );
    }
    let holding = state
        .owners
        .iter()
        .filter(|(_, h)| matches!(h, Held::Value(_)))
        .count();
    let wanted = state.replicas.min(state.owners.len());
    if holding > 0 && holding < wanted {
        let each: Vec<String> = state
            .owners
            .iter()
            .map(|(n, h)| format!("{n}={h}"))
            .collect();
        push(
            AnomalyKind::UnderReplicated,
            format!("{holding} of {wanted} owners hold it ({})", each.join(", ")),
        );
    }
    for held in distinct {
        let holders = held_by(&state.owners, held);
        match held {
            Held::Value(v) => match ops.writer(v) {
                Err(why) => push(AnomalyKind::Phantom, format!("{holders} hold {why}")),
                Ok(w) => {
                    // An unknown write may land at any time: nothing can follow it for sure.
                    let Some(done) = w.done_by() else { continue };
                    let later: Vec<&Op> = ops.acked_writes_after(done, w.id).collect();
                    let deletes: Vec<&&Op> =
                        later.iter().filter(|o| o.kind == OpKind::Delete).collect();
                    let (kind, followers): (_, Vec<&&Op>) = if deletes.is_empty() {
                        (AnomalyKind::LostWrite, later.iter().collect())
                    } else {
                        (AnomalyKind::ResurrectedDelete, deletes)
                    };
                    if let Some(last) = followers.last() {
                        push(
                            kind,
                            format!(
                                "{holders} hold {v} from {w}, but {} acknowledged op(s) followed it, the last {last}",
                                followers.len()
                            ),
                        );
                    }
                }
            },
            Held::Absent => {
                if let Some(w) = ops.absent_unexplained(None) {
                    push(
                        AnomalyKind::LostWrite,
                        format!("{holders} hold nothing, but {w} and no delete came after it"),
                    );
                }
            }
            Held::Unreadable(_) => {}
        }
    }
}

fn check_reads(key: &str, ops: &KeyOps, bound: Duration, out: &mut Vec<Anomaly>) {
    for g in ops
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Get && o.acked())
    {
        let mut push = |kind, detail| {
            out.push(Anomaly {
                kind,
                key: key.to_string(),
                detail,
            })
        };
        // The writes and deletes the read must reflect: acknowledged, and over more than the
        // bound before the read was invoked.
        let settled = |o: &&&Op| o.is_write() && o.acked() && o.complete + bound < g.invoke;
        match g.read_value() {
            Some(v) => {
                let w = match ops.writer(&v) {
                    Ok(w) if w.invoke > g.complete => {
                        push(
                            AnomalyKind::Phantom,
                            format!("{g} read {v} before its write began: {w}"),
                        );
                        continue;
                    }
                    Ok(w) => w,
                    Err(why) => {
                        push(AnomalyKind::Phantom, format!("{g}: {why}"));
                        continue;
                    }
                };
                let replaced = ops
                    .ops
                    .iter()
                    .filter(settled)
                    .filter(|a| a.id != w.id && w.completed_before(a.invoke))
                    .max_by_key(|a| a.invoke);
                if let Some(a) = replaced {
                    push(
                        AnomalyKind::StaleRead,
                        format!("{g}, written by {w}, though {a} had replaced it"),
                    );
                }
            }
            None => {
                // Absent at the read: some delete, invoked before the read ended, must not have
                // been over before the last settled write was invoked.
                let last = ops
                    .ops
                    .iter()
                    .filter(settled)
                    .filter(|a| matches!(a.kind, OpKind::Put(_)))
                    .max_by_key(|a| a.invoke);
                if let Some(a) = last {
                    let explained = ops.ops.iter().any(|d| {
                        d.kind == OpKind::Delete
                            && d.may_have_applied()
                            && d.invoke < g.complete
                            && !d.completed_before(a.invoke)
                    });
                    if !explained {
                        push(
                            AnomalyKind::StaleRead,
                            format!("{g} though {a} and no delete after it"),
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t: u64) -> Duration {
        Duration::from_millis(t)
    }

    /// A small history builder: operations on one key, times in ms.
    struct H(Vec<Op>);

    impl H {
        fn new() -> H {
            H(Vec::new())
        }
        fn op(mut self, kind: OpKind, at: (u64, u64), outcome: Outcome) -> H {
            self.0.push(Op {
                id: self.0.len(),
                client: 0,
                node: 0,
                key: "k".into(),
                kind,
                invoke: ms(at.0),
                complete: ms(at.1),
                outcome,
            });
            self
        }
        fn put(self, v: &str, at: (u64, u64)) -> H {
            self.op(OpKind::Put(v.into()), at, Outcome::Ok(None))
        }
        fn put_unknown(self, v: &str, at: (u64, u64)) -> H {
            self.op(OpKind::Put(v.into()), at, Outcome::Unknown("503".into()))
        }
        fn put_failed(self, v: &str, at: (u64, u64)) -> H {
            self.op(OpKind::Put(v.into()), at, Outcome::Failed("403".into()))
        }
        fn del(self, at: (u64, u64)) -> H {
            self.op(OpKind::Delete, at, Outcome::Ok(None))
        }
        fn del_unknown(self, at: (u64, u64)) -> H {
            self.op(OpKind::Delete, at, Outcome::Unknown("timeout".into()))
        }
        fn get(self, read: Option<&str>, at: (u64, u64)) -> H {
            self.op(OpKind::Get, at, Outcome::Ok(read.map(String::from)))
        }
    }

    fn owners(held: &[Held]) -> BTreeMap<String, KeyState> {
        let owners = held
            .iter()
            .enumerate()
            .map(|(i, h)| (format!("node{i}"), h.clone()))
            .collect();
        BTreeMap::from([(
            "k".to_string(),
            KeyState {
                replicas: 2,
                owners,
                others: Vec::new(),
            },
        )])
    }

    fn v(s: &str) -> Held {
        Held::Value(s.into())
    }

    fn run(h: H, held: &[Held]) -> Report {
        check(&h.0, &owners(held), ms(100))
    }

    fn only(r: &Report, kind: AnomalyKind) {
        let kinds: BTreeSet<AnomalyKind> = r.anomalies.iter().map(|a| a.kind).collect();
        assert_eq!(kinds, BTreeSet::from([kind]), "{:#?}", r.anomalies);
    }

    #[test]
    fn a_clean_history_passes() {
        let h = H::new()
            .put("a", (0, 10))
            .get(Some("a"), (20, 30))
            .put("b", (40, 50))
            // Concurrent with the write of b: either answer is right.
            .get(Some("a"), (45, 55))
            .del((60, 70))
            .get(None, (200, 210))
            .put("c", (300, 310))
            .get(Some("c"), (500, 510));
        let r = run(h, &[v("c"), v("c")]);
        assert!(r.anomalies.is_empty(), "{:#?}", r.anomalies);
        assert_eq!((r.ops, r.acked), (8, 8));
    }

    #[test]
    fn concurrent_writes_may_end_either_way() {
        // b and c overlap: either may win, on every owner alike.
        for last in ["b", "c"] {
            let h = H::new()
                .put("a", (0, 10))
                .put("b", (20, 60))
                .put("c", (30, 50));
            let r = run(h, &[v(last), v(last)]);
            assert!(r.anomalies.is_empty(), "{last}: {:#?}", r.anomalies);
        }
    }

    #[test]
    fn a_final_value_an_acknowledged_write_followed_is_a_lost_write() {
        let h = H::new().put("a", (0, 10)).put("b", (20, 30));
        let r = run(h, &[v("a"), v("a")]);
        only(&r, AnomalyKind::LostWrite);
        assert!(
            r.anomalies[0].detail.contains("PUT k=b"),
            "{:#?}",
            r.anomalies
        );
    }

    #[test]
    fn an_unknown_write_may_land_late() {
        // a's answer was lost: it may still apply after b, so ending on a is no anomaly.
        let h = H::new().put_unknown("a", (0, 10)).put("b", (20, 30));
        let r = run(h, &[v("a"), v("a")]);
        assert!(r.anomalies.is_empty(), "{:#?}", r.anomalies);
        // But an unknown write that followed does not excuse an older value.
        let h = H::new()
            .put("a", (0, 10))
            .put("b", (20, 30))
            .put_unknown("c", (40, 50));
        only(&run(h, &[v("a"), v("a")]), AnomalyKind::LostWrite);
    }

    #[test]
    fn a_value_back_after_an_acknowledged_delete_is_a_resurrection() {
        let h = H::new().put("a", (0, 10)).del((20, 30));
        let r = run(h, &[v("a"), v("a")]);
        only(&r, AnomalyKind::ResurrectedDelete);
        // A delete concurrent with the write may have gone first.
        let h = H::new().put("a", (0, 30)).del((20, 25));
        assert!(run(h, &[v("a"), v("a")]).anomalies.is_empty());
    }

    #[test]
    fn absent_needs_a_delete_after_the_last_acknowledged_write() {
        let h = H::new().put("a", (0, 10)).del((20, 30)).put("b", (40, 50));
        let r = run(h, &[Held::Absent, Held::Absent]);
        only(&r, AnomalyKind::LostWrite);
        assert!(
            r.anomalies[0].detail.contains("PUT k=b"),
            "{:#?}",
            r.anomalies
        );
        // An unknown delete after it may have applied.
        let h = H::new().put("a", (0, 10)).del_unknown((20, 30));
        assert!(run(h, &[Held::Absent, Held::Absent]).anomalies.is_empty());
        // Never acknowledged: absent is the initial state.
        let h = H::new().put_unknown("a", (0, 10)).put_failed("b", (20, 30));
        assert!(run(h, &[Held::Absent, Held::Absent]).anomalies.is_empty());
        // A delete concurrent with the last write explains it.
        let h = H::new().put("a", (0, 50)).del((20, 30));
        assert!(run(h, &[Held::Absent, Held::Absent]).anomalies.is_empty());
    }

    #[test]
    fn owners_that_disagree_diverge_and_a_missing_copy_is_under_replication() {
        let h = H::new().put("a", (0, 10)).put_unknown("b", (20, 30));
        let r = run(h, &[v("a"), v("b")]);
        only(&r, AnomalyKind::Divergent);
        assert!(
            r.anomalies[0].detail.contains("node0=a"),
            "{:#?}",
            r.anomalies
        );

        let h = H::new().put("a", (0, 10));
        let r = run(h, &[v("a"), Held::Absent]);
        let kinds: BTreeSet<AnomalyKind> = r.anomalies.iter().map(|a| a.kind).collect();
        // One owner lost the acknowledged write, so the absent copy is a lost write as well.
        assert_eq!(
            kinds,
            BTreeSet::from([
                AnomalyKind::Divergent,
                AnomalyKind::UnderReplicated,
                AnomalyKind::LostWrite
            ])
        );
        assert_eq!(r.keys(AnomalyKind::UnderReplicated), BTreeSet::from(["k"]));
    }

    #[test]
    fn reads_are_judged_with_the_bound() {
        // Read a, 50 ms after b was acknowledged: within the 100 ms bound.
        let h = H::new()
            .put("a", (0, 10))
            .put("b", (20, 30))
            .get(Some("a"), (80, 90));
        assert!(run(h, &[v("b"), v("b")]).anomalies.is_empty());
        // 300 ms after: stale.
        let h = H::new()
            .put("a", (0, 10))
            .put("b", (20, 30))
            .get(Some("a"), (330, 340));
        let r = run(h, &[v("b"), v("b")]);
        only(&r, AnomalyKind::StaleRead);
        assert!(
            r.anomalies[0].detail.contains("PUT k=b"),
            "{:#?}",
            r.anomalies
        );
        // Absent long after an acknowledged write, with no delete: stale.
        let h = H::new().put("a", (0, 10)).get(None, (300, 310));
        only(&run(h, &[v("a"), v("a")]), AnomalyKind::StaleRead);
        // A value long after an acknowledged delete: stale.
        let h = H::new()
            .put("a", (0, 10))
            .del((20, 30))
            .get(Some("a"), (300, 310));
        only(
            &run(h, &[Held::Absent, Held::Absent]),
            AnomalyKind::StaleRead,
        );
    }

    #[test]
    fn values_no_write_explains_are_phantoms() {
        let h = H::new().put_failed("a", (0, 10)).get(Some("a"), (20, 30));
        let r = run(h, &[v("a"), v("a")]);
        assert_eq!(r.count(AnomalyKind::Phantom), 2, "{:#?}", r.anomalies);
        let h = H::new().get(Some("z"), (0, 10)).put("z", (20, 30));
        let r = run(h, &[v("z"), v("z")]);
        only(&r, AnomalyKind::Phantom);
        let r = run(H::new(), &[v("q"), v("q")]);
        only(&r, AnomalyKind::Phantom);
    }

    #[test]
    fn converged_means_every_owner_holds_the_same() {
        let state = |held: &[Held]| owners(held).remove("k").unwrap();
        assert!(state(&[v("a"), v("a")]).converged());
        assert!(state(&[Held::Absent, Held::Absent]).converged());
        assert!(!state(&[v("a"), v("b")]).converged());
        assert!(!state(&[v("a"), Held::Absent]).converged());
        assert!(!state(&[v("a"), Held::Unreadable("x".into())]).converged());
    }

    #[test]
    fn unreadable_owners_are_reported() {
        let h = H::new().put("a", (0, 10));
        let r = run(h, &[v("a"), Held::Unreadable("503".into())]);
        assert_eq!(r.count(AnomalyKind::Unreadable), 1, "{:#?}", r.anomalies);
        assert_eq!(r.count(AnomalyKind::LostWrite), 0);
    }

    #[test]
    fn the_summary_counts_every_kind() {
        let h = H::new().put("a", (0, 10)).del((20, 30));
        let r = run(h, &[v("a"), Held::Absent]);
        let line = r.summary(r#""scenario":"t""#);
        let doc: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(doc["scenario"], "t");
        assert_eq!(doc["resurrected"], 1);
        assert_eq!(doc["divergent"], 1);
        assert_eq!(doc["under_replicated"], 1);
        assert_eq!(doc["lost"], 0);
        assert_eq!(doc["ops"], 2);
    }
}
