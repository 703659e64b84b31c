//! The policy's `trusted_proxies`: whose forwarding headers are believed,
//! and which header they write.

use serde_saphyr::Spanned;

use crate::error::{Invalid, at};
use crate::identity::client_ip::{ForwardingHeader, TrustedProxies};
use crate::schema::RawTrustedProxies;

pub(super) fn trusted_proxies(
    t: &Spanned<RawTrustedProxies>,
    warnings: &mut Vec<Invalid>,
) -> Result<TrustedProxies, Invalid> {
    let list = &t.value.cidrs;
    let cidrs: Vec<&str> = list.iter().map(|s| s.value.as_str()).collect();
    let proxies = TrustedProxies::parse(&cidrs).map_err(|e| match list.get(e.index) {
        Some(entry) => at(entry, e.message),
        None => at(t, e.message),
    })?;
    match &t.value.header {
        Some(h) => match ForwardingHeader::parse(&h.value) {
            Some(header) => Ok(proxies.with_header(header)),
            None => Err(at(
                h,
                format!(
                    "`header` {:?} is not a forwarding header; expected `forwarded` or \
                     `x-forwarded-for`, whichever the proxies write",
                    h.value
                ),
            )),
        },
        None => {
            if !proxies.is_empty() {
                warnings.push(at(
                    t,
                    "trusted_proxies does not say which header the proxies write, so both \
                     `Forwarded` and `X-Forwarded-For` are read, and a client that adds the \
                     one its proxy passes on unchanged is keyed on the proxy's address; write \
                     `trusted_proxies: {cidrs: [...], header: x-forwarded-for}` (or `forwarded`)",
                ));
            }
            Ok(proxies)
        }
    }
}
