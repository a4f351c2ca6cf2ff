//! Bearer-token authentication: every request carries `Authorization: Bearer <token>` (a
//! token from `yutu token issue`, or the one a node prints at its first start).

use yutu_api::token::BEARER;

/// A ureq middleware that adds the token to every request of its agent.
#[derive(Debug, Clone)]
pub(crate) struct Bearer {
    header: ureq::http::HeaderValue,
}

impl Bearer {
    /// `None` when the token cannot be a header value (control characters).
    pub(crate) fn new(token: &str) -> Option<Bearer> {
        let mut value =
            ureq::http::HeaderValue::from_str(&format!("{BEARER}{}", token.trim())).ok()?;
        value.set_sensitive(true);
        Some(Bearer { header: value })
    }
}

impl ureq::middleware::Middleware for Bearer {
    fn handle(
        &self,
        mut request: ureq::http::Request<ureq::SendBody>,
        next: ureq::middleware::MiddlewareNext,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        request
            .headers_mut()
            .insert(ureq::http::header::AUTHORIZATION, self.header.clone());
        next.handle(request)
    }
}
