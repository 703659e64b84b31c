//! Who may call what: how a request shows a token, which requests a
//! browser sent for a web page, and which bodies are JSON. The decision
//! API and the dashboard decide with these; docs/http-api.md ("Who may call
//! what") says what each endpoint asks of its callers.

use axum::http::{HeaderMap, HeaderName, StatusCode, Uri, header};
use axum::response::Response;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::endpoints::problem;

/// Whether `headers` carry `token` as a bearer token, or, when `basic`
/// allows it, as the password of HTTP basic authentication (which browsers
/// prompt for; any user name). Their SHA-256 digests are compared in
/// constant time, so that response times say nothing about how much of a
/// guess was right, or how long the token is.
///
/// Basic authentication suits only what is safe to read: a browser sends
/// credentials it has cached with requests that other sites make it send.
pub(crate) fn holds_token(token: &str, headers: &HeaderMap, basic: bool) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    // Digests first: equal lengths, so that not even the token's length
    // shows in the time a comparison takes.
    let same = |given: &[u8]| {
        constant_time_eq::constant_time_eq(&Sha256::digest(given), &Sha256::digest(token))
    };
    if let Some(bearer) = sluice_policy::bearer_token(given) {
        return same(bearer.as_bytes());
    }
    let Some((scheme, encoded)) = given.trim().split_once(' ') else {
        return false;
    };
    if !basic || !scheme.eq_ignore_ascii_case("basic") {
        return false;
    }
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    decoded
        .iter()
        .position(|&b| b == b':')
        .is_some_and(|colon| same(&decoded[colon + 1..]))
}

/// Whether a `Host` names an IP address or `localhost`, with or without a
/// port: a name no web page can point at the server's address, as it can
/// a name of its own (DNS rebinding).
pub(crate) fn is_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, rest)) if rest.is_empty() || rest.starts_with(':') => addr,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Where a browser says a request comes from: `same-origin`, `same-site`,
/// `cross-site`, or `none` when a person asked for it (typed the address).
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Why the request `uri` and `headers` describe is one a browser sent for
/// a web page other than the server's own, if it is: a page that could be
/// any site its visitors open.
///
/// A browser marks what a page sends: `Origin` on every request but a
/// same-origin GET, `Sec-Fetch-Site` on every request to a secure or local
/// address. A request with neither, as services, load balancers and curl
/// send, is no page's, whatever it is addressed to. A page's request is
/// its own server's only when the browser says so (`Sec-Fetch-Site:
/// same-origin`, or an `Origin` that is the address the request went to)
/// and that address is an IP address or `localhost`: a page can point a
/// name of its own at the server, and the browser then takes the server for
/// the page's own origin.
pub(crate) fn foreign_page(uri: &Uri, headers: &HeaderMap) -> Option<&'static str> {
    let origin = headers.get(header::ORIGIN);
    let site = headers.get(SEC_FETCH_SITE);
    if origin.is_none() && site.is_none_or(|s| s == "none") {
        return None;
    }
    if site.is_some_and(|s| s != "same-origin" && s != "none") {
        return Some("the browser sent it for a page of another site (`Sec-Fetch-Site`)");
    }
    let host = match headers.get(header::HOST) {
        Some(host) => host.to_str().ok(),
        None => uri.authority().map(|a| a.as_str()),
    };
    let Some(host) = host else {
        return Some("it names no host");
    };
    let from_host = |origin: &str| {
        origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
    };
    if origin.is_some_and(|o| !o.to_str().is_ok_and(from_host)) {
        return Some("a page of another origin sent it (`Origin`)");
    }
    if !is_address(host) {
        return Some(
            "a page sent it to a name (`Host`), which any site can point at this server \
             (DNS rebinding); a page of the server's own is opened by address",
        );
    }
    None
}

/// Whether `headers` announce a JSON body: `application/json`, in any case,
/// with any parameters (`; charset=utf-8`). A web page can make a browser
/// send any other body, `text/plain`, a form or no type at all, to any
/// site without asking it first; JSON needs the site's leave (a CORS
/// preflight), which this server never gives.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split_once(';').map_or(v, |(essence, _)| essence);
            essence.trim().eq_ignore_ascii_case("application/json")
        })
}

/// The 415 for a body that [`is_json`] refuses.
pub(crate) fn not_json(headers: &HeaderMap) -> Response {
    let sent = match headers.get(header::CONTENT_TYPE) {
        Some(v) => format!("`{}`", String::from_utf8_lossy(v.as_bytes())),
        None => "no `Content-Type`".to_owned(),
    };
    problem(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "the request body must be JSON, sent with `Content-Type: application/json`; \
             this one came with {sent}"
        ),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    fn page(pairs: &[(&str, &str)]) -> Option<&'static str> {
        foreign_page(&Uri::from_static("/v1/limit"), &headers(pairs))
    }

    #[test]
    fn a_request_no_browser_marked_is_no_pages_whatever_its_host() {
        for host in ["sluice.internal", "127.0.0.1:8080", "evil.example"] {
            assert_eq!(page(&[("host", host)]), None, "{host}");
            assert_eq!(page(&[("host", host), ("sec-fetch-site", "none")]), None);
        }
    }

    #[test]
    fn a_pages_request_passes_only_from_the_servers_own_origin_on_an_address() {
        for own in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:8080",
            "LOCALHOST",
        ] {
            let origin = format!("http://{own}");
            assert_eq!(page(&[("host", own), ("origin", &origin)]), None, "{own}");
            let same = [("host", own), ("sec-fetch-site", "same-origin")];
            assert_eq!(page(&same), None, "{own}");
        }
        let refused: [&[(&str, &str)]; 7] = [
            &[
                ("host", "127.0.0.1:8080"),
                ("origin", "https://evil.example"),
            ],
            &[
                ("host", "127.0.0.1:8080"),
                ("origin", "http://127.0.0.1:8081"),
            ],
            &[("host", "127.0.0.1:8080"), ("origin", "null")],
            &[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
            &[("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-site")],
            &[
                ("host", "evil.example:8080"),
                ("origin", "http://evil.example:8080"),
            ],
            &[("origin", "http://127.0.0.1:8080")],
        ];
        for pairs in refused {
            assert!(page(pairs).is_some(), "{pairs:?}");
        }
        // Over HTTP/2 the address is the URI's.
        let h2 = foreign_page(
            &Uri::from_static("http://127.0.0.1:8080/v1/limit"),
            &headers(&[("origin", "http://127.0.0.1:8080")]),
        );
        assert_eq!(h2, None);
    }

    #[test]
    fn json_is_application_json_in_any_case_with_any_parameters() {
        for ctype in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            " application/json ;charset=UTF-8",
        ] {
            assert!(is_json(&headers(&[("content-type", ctype)])), "{ctype}");
        }
        for ctype in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "application/json-seq",
            "",
        ] {
            assert!(!is_json(&headers(&[("content-type", ctype)])), "{ctype}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn an_address_is_an_ip_or_localhost_with_or_without_a_port() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]:8080",
            "[::1]",
            "localhost:1",
        ] {
            assert!(is_address(host), "{host}");
        }
        for host in [
            "sluice.internal",
            "evil.example:8080",
            "[::1]x",
            "localhost.evil",
        ] {
            assert!(!is_address(host), "{host}");
        }
    }
}
