//! Requests between the members of a cluster: where an object request is served
//! (`coordinate`), forwarding it (`forward`), replicating writes and the cluster's object
//! calls (`cluster`), and asking other members' local admin API (`call`).

pub mod call;
pub mod cluster;
pub mod coordinate;
pub mod forward;
