use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use sluice_policy::TrustedProxies;

/// The socket peer when the first line names none: a trusted proxy, so that
/// the headers are read.
const DEFAULT_PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

/// Works out a request's client address with [`TrustedProxies::client_ip`].
///
/// The input is text (lossily decoded as UTF-8): the first line is the
/// socket peer's address, and each later line is a header, `Forwarded: ...`
/// or `X-Forwarded-For: ...` (names in any case); other lines are ignored.
/// A first line that is no address is parsed as a `trusted_proxies` entry
/// instead, and the peer is a trusted proxy.
///
/// Checks that nothing panics and that the answer keeps the promises of the
/// documentation: it is in canonical form (IPv4-mapped addresses as IPv4);
/// an untrusted peer, or a trusted one without forwarding headers, is the
/// client itself; and otherwise the client is the peer or an address named
/// in one of the headers.
pub fn client_ip(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default().trim();
    let peer = match first.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            let _ = TrustedProxies::parse(&[first]);
            DEFAULT_PEER
        }
    };
    let mut forwarded = Vec::new();
    let mut x_forwarded_for = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("forwarded") {
            forwarded.push(value);
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            x_forwarded_for.push(value);
        }
    }

    let proxies = proxies();
    let client = proxies.client_ip(
        peer,
        forwarded.iter().copied(),
        x_forwarded_for.iter().copied(),
    );
    let peer = peer.to_canonical();
    assert_eq!(client, client.to_canonical(), "{client} is not canonical");
    let headers = forwarded.iter().chain(&x_forwarded_for);
    if !proxies.contains(peer) || headers.clone().all(|v| v.trim().is_empty()) {
        assert_eq!(
            client, peer,
            "the client of {peer} without believed headers"
        );
    }
    if client != peer {
        // Every address a header can name appears in it as text, though
        // perhaps in another spelling: compare parsed candidates, not text.
        let named = headers.flat_map(|v| candidates(v)).any(|ip| ip == client);
        assert!(named, "{client} appears in no header");
    }
}

/// The trusted proxies: IPv4 and IPv6 networks, one given in IPv4-mapped
/// form, and a single address.
fn proxies() -> &'static TrustedProxies {
    static PROXIES: OnceLock<TrustedProxies> = OnceLock::new();
    PROXIES.get_or_init(|| {
        TrustedProxies::parse(&[
            "10.0.0.0/8",
            "2001:db8:ffff::/48",
            "::ffff:172.16.0.0/108",
            "192.0.2.7",
        ])
        .expect("the proxies are valid")
    })
}

/// Every address that some substring of `value` spells, canonical: a
/// superset of what a header walk can return.
fn candidates(value: &str) -> Vec<IpAddr> {
    // Quoted strings may escape any character; dropping every backslash
    // can only join more text into candidates.
    let unescaped = value.replace('\\', "");
    unescaped
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
        .flat_map(|token| {
            // `[v6]:port` and `v4:port` leave a port after the address; try
            // the whole token and every prefix ending before a colon.
            let cuts = token.match_indices(':').map(|(i, _)| i);
            std::iter::once(token.len())
                .chain(cuts)
                .filter_map(move |end| token.get(..end)?.parse::<IpAddr>().ok())
        })
        .map(|ip| ip.to_canonical())
        .collect()
}
