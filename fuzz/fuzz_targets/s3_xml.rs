//! The S3 XML bodies a client sends: DeleteObjects, CompleteMultipartUpload, ACL
//! (`AccessControlPolicy`), CORS (`CORSConfiguration`), public access block and ownership
//! controls documents. Never panics; a document that parses has what the handlers index into,
//! and an accepted ACL, CORS, public access block or ownership document renders back to one
//! that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::acl::{parse_policy, Acl, Principal, Permission};
use yutu_api::cors::CorsConfiguration;
use yutu_api::ownership::ObjectOwnership;
use yutu_api::public_access_block::PublicAccessBlock;
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
    if let Ok(block) = PublicAccessBlock::parse(s) {
        assert_eq!(PublicAccessBlock::parse(&block.to_xml()).ok(), Some(block));
    }
    if let Ok(o) = ObjectOwnership::from_xml(s) {
        assert_eq!(ObjectOwnership::from_xml(&o.to_xml()).ok(), Some(o));
    }
});
