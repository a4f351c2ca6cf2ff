//! Which etcd endpoints a client may use, and in what order it tries them.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::EtcdError;

/// Checks an endpoint (`http://host:port` or `https://host:port`, nothing after it) and
/// drops a trailing `/`.
pub fn endpoint(url: &str) -> Result<String, EtcdError> {
    let url = url.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let ok = rest.is_some_and(|r| !r.is_empty() && !r.contains('/'))
        && url.len() <= 2048
        && url.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(url.to_owned())
    } else {
        Err(EtcdError::BadEndpoint(url.chars().take(80).collect()))
    }
}

/// The endpoints of one etcd cluster and the one that answered last: a call tries that one
/// first, then the next ones in turn (another member may well answer when one is down).
/// Shared between threads (the conductor's blocking pool), hence the atomic.
#[derive(Debug)]
pub struct Endpoints {
    urls: Vec<String>,
    current: AtomicUsize,
}

impl Endpoints {
    /// Validated endpoints; at least one.
    pub fn new(urls: &[String]) -> Result<Endpoints, EtcdError> {
        if urls.is_empty() {
            return Err(EtcdError::NoEndpoint);
        }
        let urls = urls
            .iter()
            .map(|u| endpoint(u))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Endpoints {
            urls,
            current: AtomicUsize::new(0),
        })
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The order of one call's tries: `(index, url)`, the one that answered last first.
    pub fn order(&self) -> impl Iterator<Item = (usize, &str)> + '_ {
        let first = self.current.load(Ordering::Relaxed);
        let n = self.urls.len();
        (0..n).map(move |k| {
            let i = (first + k) % n;
            (i, self.urls[i].as_str())
        })
    }

    /// Endpoint `i` answered: the next call starts with it.
    pub fn answered(&self, i: usize) {
        if i < self.urls.len() {
            self.current.store(i, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(Endpoints::new(&[]).map(|_| ()), Err(EtcdError::NoEndpoint));
        for bad in [
            "127.0.0.1:2379",
            "ftp://x",
            "http://",
            "http://a/b",
            "http://a b",
        ] {
            assert!(
                matches!(endpoint(bad), Err(EtcdError::BadEndpoint(_))),
                "{bad}"
            );
        }
        let e = Endpoints::new(&["http://127.0.0.1:2379/".into(), "https://e2:2379".into()])
            .expect("valid");
        assert_eq!(e.urls(), ["http://127.0.0.1:2379", "https://e2:2379"]);
    }

    #[test]
    fn the_endpoint_that_answered_last_is_tried_first() {
        let e = Endpoints::new(&[
            "http://a:1".into(),
            "http://b:1".into(),
            "http://c:1".into(),
        ])
        .expect("valid");
        let order = |e: &Endpoints| e.order().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(order(&e), [0, 1, 2]);
        e.answered(2);
        assert_eq!(order(&e), [2, 0, 1]);
        assert_eq!(e.order().next().map(|(_, u)| u), Some("http://c:1"));
        e.answered(9);
        assert_eq!(
            order(&e),
            [2, 0, 1],
            "an index out of range changes nothing"
        );
    }
}
