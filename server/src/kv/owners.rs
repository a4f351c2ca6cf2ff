//! The one way a KV call reaches the shards that own its keys: the keys (or the lease and put
//! ids, which name their shard) grouped by owner, one job per owning shard, every shard at
//! once, and the answers put back in the request's order.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::kv::error::KvError;
use crate::node::{Shard, ShardError};
use crate::tier::Step;

/// A request's indices grouped by owning shard, in shard order.
pub struct Owners {
    groups: Vec<(usize, Vec<usize>)>,
    len: usize,
}

impl Owners {
    /// `keys` of `bucket` by the shard that owns each.
    pub fn of_keys(here: &Shard, bucket: &str, keys: &[String]) -> Owners {
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            groups.entry(here.owner(bucket, k)).or_default().push(i);
        }
        Owners {
            groups: groups.into_iter().collect(),
            len: keys.len(),
        }
    }

    /// Lease or put `ids` by the shard that issued each; an id no shard issued is refused.
    pub fn of_ids(here: &Shard, ids: &[u64]) -> Result<Owners, KvError> {
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            let shard = here
                .shard_of_id(*id)
                .ok_or_else(|| KvError::invalid(format!("Unknown id {id}.")))?;
            groups.entry(shard).or_default().push(i);
        }
        Ok(Owners {
            groups: groups.into_iter().collect(),
            len: ids.len(),
        })
    }

    /// Whether `shard` owns everything (then the call runs in place: no job, no copies).
    pub fn only(&self, shard: usize) -> bool {
        matches!(self.groups.as_slice(), [(s, _)] if *s == shard)
    }

    /// The owning shards with the indices each owns.
    pub fn groups(&self) -> &[(usize, Vec<usize>)] {
        &self.groups
    }

    /// Runs `job` on every owning shard with its part of the request (what `part` takes
    /// from its indices), all shards at once; per owner, in [`Self::groups`]' order, its
    /// answer. A [`Step`] job answers at once or from a task on its shard.
    pub async fn run<I, T, J>(
        &self,
        here: &Rc<Shard>,
        mut part: impl FnMut(&[usize]) -> I,
        job: J,
    ) -> Vec<Result<T, ShardError>>
    where
        I: Send + 'static,
        T: Send + 'static,
        J: FnOnce(&Rc<Shard>, I) -> Step<T> + Clone + Send + 'static,
    {
        let calls = self.groups.iter().map(|(shard, idx)| {
            let (input, job) = (part(idx), job.clone());
            here.run_step(*shard, move |s| job(s, input))
        });
        futures::future::join_all(calls).await
    }

    /// Per-index answers (each owner's in the order of its indices) back in request order.
    /// An owner whose answer is short leaves its other indices at `T::default()`.
    pub fn gather<T: Default>(&self, answers: impl IntoIterator<Item = Vec<T>>) -> Vec<T> {
        let mut out: Vec<T> = (0..self.len).map(|_| T::default()).collect();
        for ((_, idx), answer) in self.groups.iter().zip(answers) {
            for (i, a) in idx.iter().zip(answer) {
                out[*i] = a;
            }
        }
        out
    }
}

/// The items of `all` at `idx`, in that order.
pub fn pick<T: Clone>(all: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| all[i].clone()).collect()
}
