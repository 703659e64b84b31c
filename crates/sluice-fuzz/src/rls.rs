use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use prost::Message;
use sluice_server::serve::Rls;

use crate::service::{block_on, state};

/// Decodes `data` as a protobuf `RateLimitRequest` (Envoy's rate limit
/// service, v3) and asks [`Rls`], over the fuzzing policy and an empty
/// in-memory store, `ShouldRateLimit` twice, the second call meeting the
/// state the first one left. Bytes that are no such message are skipped:
/// tonic refuses them before the service sees them.
///
/// Checks that nothing panics; that an error is only ever the refusal of a
/// request without a domain or without descriptors (a descriptor's limit
/// override the server cannot use leaves the rule's limit in force); and
/// that an answer has one status per descriptor.
pub fn rls(data: &[u8]) {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let rls = Rls::new(state());
    block_on(async {
        for _ in 0..2 {
            match rls
                .should_rate_limit(tonic::Request::new(request.clone()))
                .await
            {
                Ok(response) => assert_eq!(
                    response.get_ref().statuses.len(),
                    request.descriptors.len(),
                    "{request:?}"
                ),
                Err(status) => assert!(
                    request.domain.is_empty() || request.descriptors.is_empty(),
                    "{status} for {request:?}"
                ),
            }
        }
    });
}
