//! The S3 XML bodies a client sends: DeleteObjects, CompleteMultipartUpload, ACL
//! (`AccessControlPolicy`) and CORS (`CORSConfiguration`) documents. Never panics; a document
//! that parses has what the handlers index into, and an accepted ACL or CORS configuration
//! renders back to one that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::acl::{parse_policy, Acl, Principal, Permission};
use yutu_api::cors::CorsConfiguration;
use yutu_api::xml::{from_xml, to_xml, CompleteRequest, DeleteRequest};

fuzz_target!(|s: &str| {
    if let Ok(d) = from_xml::<DeleteRequest>(s) {
        let _ = d.objects.len();
    }
    if let Ok(c) = from_xml::<CompleteRequest>(s) {
        let _ = c.parts.len();
    }
    if let Ok(doc) = parse_policy(s) {
        if let Ok(acl) = Acl::from_policy(&doc, "owner") {
            let _ = acl.allows(Principal::Anonymous, Permission::Read);
            let again = to_xml("AccessControlPolicy", &acl.to_policy("owner"));
            let back = parse_policy(&again).expect("a rendered ACL parses");
            assert_eq!(Acl::from_policy(&back, "owner").ok(), Some(acl));
        }
    }
    if let Ok(cors) = CorsConfiguration::parse(s) {
        let _ = cors.find("https://a.example", "GET", &["x-amz-date".to_string()]);
        let again = to_xml("CORSConfiguration", &cors);
        assert_eq!(CorsConfiguration::parse(&again).ok(), Some(cors));
    }
});
