//! The S3 XML bodies a client sends: DeleteObjects and CompleteMultipartUpload documents.
//! Never panics; a document that parses has what the handlers index into.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::xml::{from_xml, CompleteRequest, DeleteRequest};

fuzz_target!(|s: &str| {
    if let Ok(d) = from_xml::<DeleteRequest>(s) {
        let _ = d.objects.len();
    }
    if let Ok(c) = from_xml::<CompleteRequest>(s) {
        let _ = c.parts.len();
    }
});
