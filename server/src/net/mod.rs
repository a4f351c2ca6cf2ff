//! hyper 1.x on glommio: the I/O adapter, the timer, and the small HTTP/1 client the node
//! uses for its own outgoing calls (KV events to the conductor).

pub mod budget;
pub mod client;
pub mod io;
pub mod timer;
pub mod tls;
