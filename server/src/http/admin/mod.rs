//! The admin API (`/admin/...`): answered for the whole cluster by any node (`fanout`), and
//! this node's own part of each call (`local`, `/admin/v1/local/...`).

pub mod fanout;
pub mod local;
