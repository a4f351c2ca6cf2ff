//! Everything a handler needs about one request, once it is routed and authenticated.

use std::rc::Rc;

use http::{HeaderMap, Method, Uri};

use super::error::S3Error;
use super::target::Target;
use crate::auth::{authorize, Action, Identity};
use crate::s3::authenticate::RequestAuth;
use crate::shard::Shard;

pub struct Ctx {
    pub shard: Rc<Shard>,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub target: Target,
    pub auth: RequestAuth,
}

impl Ctx {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn identity(&self) -> &Identity {
        &self.auth.identity
    }

    pub fn allow(&self, action: Action, bucket: Option<&str>) -> Result<(), S3Error> {
        authorize(&self.shard, &self.auth.identity, action, bucket)
    }
}
