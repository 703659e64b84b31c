//! The client address of a request: the socket peer, unless that peer is one
//! of the policy's `trusted_proxies`. Only then are `Forwarded` (RFC 7239) and
//! `X-Forwarded-For` read, right to left, and only as far as trusted proxies
//! vouch for them, so a client cannot pick its own rate-limit key by sending
//! a forged header.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The policy's `trusted_proxies`: IPv4 and IPv6 CIDRs, a bare address
/// meaning that one address (/32 or /128).
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) are treated as the IPv4
/// address they carry, in the list and in requests alike, because dual-stack
/// sockets report IPv4 peers that way.
///
/// ```
/// use sluice_policy::TrustedProxies;
/// let proxies = TrustedProxies::parse(&["10.0.0.0/8", "2001:db8::1"])?;
/// assert!(proxies.contains("10.1.2.3".parse().unwrap()));
/// assert!(proxies.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!proxies.contains("2001:db8::2".parse().unwrap()));
///
/// // A client behind the proxy at 10.0.0.7:
/// let peer = "10.0.0.7".parse().unwrap();
/// let ip = proxies.client_ip(peer, [], ["198.51.100.1, 203.0.113.9"]);
/// assert_eq!(ip, "203.0.113.9".parse::<std::net::IpAddr>().unwrap());
/// # Ok::<(), sluice_policy::TrustedProxiesError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: Option<ForwardingHeader>,
}

/// The forwarding header that the trusted proxies write. A proxy keeps one
/// and passes the other on as the client sent it; reading only the one it
/// keeps leaves a client nothing to forge.
///
/// ```
/// use sluice_policy::ForwardingHeader;
/// assert_eq!(ForwardingHeader::parse("X-Forwarded-For"), Some(ForwardingHeader::XForwardedFor));
/// assert_eq!(ForwardingHeader::parse("forwarded"), Some(ForwardingHeader::Forwarded));
/// assert_eq!(ForwardingHeader::parse("x-real-ip"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardingHeader {
    /// `Forwarded` (RFC 7239).
    Forwarded,
    /// `X-Forwarded-For`.
    XForwardedFor,
}

impl ForwardingHeader {
    /// The header named `name`, in any case.
    pub fn parse(name: &str) -> Option<ForwardingHeader> {
        if name.eq_ignore_ascii_case("forwarded") {
            Some(ForwardingHeader::Forwarded)
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            Some(ForwardingHeader::XForwardedFor)
        } else {
            None
        }
    }
}

/// An entry of `trusted_proxies` that is not an address or CIDR.
///
/// ```
/// use sluice_policy::TrustedProxies;
/// let err = TrustedProxies::parse(&["10.0.0.0/8", "10.0.0.0/33"]).unwrap_err();
/// assert_eq!(err.index, 1);
/// assert!(err.to_string().contains("10.0.0.0/33"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxiesError {
    /// The position of the bad entry in the list given to
    /// [`TrustedProxies::parse`], so that callers can point at it.
    pub index: usize,
    /// What is wrong, naming the entry.
    pub message: String,
}

impl fmt::Display for TrustedProxiesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TrustedProxiesError {}

impl TrustedProxies {
    /// Parses CIDRs (`10.0.0.0/8`, `2001:db8::/32`) and bare addresses.
    /// Host bits below the prefix are ignored (`10.0.0.1/8` is `10.0.0.0/8`).
    ///
    /// ```
    /// use sluice_policy::TrustedProxies;
    /// assert!(TrustedProxies::parse(&["192.0.2.0/24", " ::1 "]).is_ok());
    /// assert!(TrustedProxies::parse(&["proxy.internal"]).is_err());
    /// ```
    pub fn parse<S: AsRef<str>>(cidrs: &[S]) -> Result<TrustedProxies, TrustedProxiesError> {
        let mut nets = Vec::with_capacity(cidrs.len());
        for (index, entry) in cidrs.iter().enumerate() {
            let entry = entry.as_ref();
            let net = parse_net(entry.trim()).ok_or_else(|| TrustedProxiesError {
                index,
                message: format!(
                    "trusted proxy {entry:?} is not an IP address or CIDR \
                     (such as 10.0.0.0/8, 192.0.2.7 or 2001:db8::/32)"
                ),
            })?;
            // A v6 prefix wide enough to hold all of ::ffff:0:0/96 covers
            // every IPv4 address too, which we compare in IPv4 form.
            if let IpNet::V6(v6) = net
                && v6.prefix_len() < 96
                && v6.contains(&MAPPED_V4)
            {
                nets.push(IpNet::V4(Ipv4Net::default()));
            }
            nets.push(canonical_net(net));
        }
        Ok(TrustedProxies { nets, header: None })
    }

    /// Reads only `header`: the one the trusted proxies write.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use sluice_policy::{ForwardingHeader, TrustedProxies};
    /// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    /// let p = TrustedProxies::parse(&["10.0.0.0/8"])?.with_header(ForwardingHeader::XForwardedFor);
    /// // The client's own `Forwarded` is not read, so it cannot spoil the
    /// // address the proxy vouched for.
    /// let forged = ["for=_hidden"];
    /// assert_eq!(p.client_ip(ip("10.0.0.1"), forged, ["192.0.2.5"]), ip("192.0.2.5"));
    /// # Ok::<(), sluice_policy::TrustedProxiesError>(())
    /// ```
    pub fn with_header(mut self, header: ForwardingHeader) -> TrustedProxies {
        self.header = Some(header);
        self
    }

    /// The one header read, when the policy names it.
    pub fn header(&self) -> Option<ForwardingHeader> {
        self.header
    }

    /// No trusted proxies: every request's client is its socket peer.
    ///
    /// ```
    /// use sluice_policy::TrustedProxies;
    /// assert!(TrustedProxies::none().is_empty());
    /// assert_eq!(TrustedProxies::none(), TrustedProxies::default());
    /// ```
    pub fn none() -> TrustedProxies {
        TrustedProxies::default()
    }

    /// Whether no proxy is trusted.
    ///
    /// ```
    /// use sluice_policy::TrustedProxies;
    /// assert!(!TrustedProxies::parse(&["127.0.0.1"]).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether `ip` is a trusted proxy.
    ///
    /// ```
    /// use sluice_policy::TrustedProxies;
    /// let p = TrustedProxies::parse(&["192.0.2.0/24"]).unwrap();
    /// assert!(p.contains("192.0.2.200".parse().unwrap()));
    /// assert!(!p.contains("192.0.3.1".parse().unwrap()));
    /// ```
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client address of a request whose socket peer is `peer`.
    ///
    /// `forwarded` holds every `Forwarded` header value and `x_forwarded_for`
    /// every `X-Forwarded-For` value, each in the order received; blank
    /// values count as absent. They are read only when `peer` is trusted.
    /// The hops of a header are walked right to left from the peer: trusted
    /// hops are skipped and the first untrusted one is the client. A hop that
    /// is obfuscated (`unknown`, `_hidden`) or unparseable ends the walk at
    /// the last trusted address reached, since nothing to its left was
    /// written by a trusted proxy. If every hop is trusted, the leftmost is
    /// the client.
    ///
    /// When the policy names the header its proxies write
    /// ([`TrustedProxies::with_header`]), only that one is read. Otherwise a
    /// proxy maintains one of the two headers and passes the other on as the
    /// client sent it, and which one is not knowable here; so when both are
    /// present and their walks name different clients, neither is believed
    /// and the client is the peer. A client cannot choose its key by adding
    /// the header its proxy does not write, but it can make its requests
    /// count against its proxy's address, which every client it cannot
    /// attribute shares: name the header to close that.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use sluice_policy::TrustedProxies;
    /// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    /// let p = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
    ///
    /// // An untrusted peer is the client, whatever it claims.
    /// assert_eq!(p.client_ip(ip("203.0.113.9"), [], ["10.0.0.1"]), ip("203.0.113.9"));
    /// // Through two trusted proxies; the leftmost entry is the client's own claim.
    /// let fwd = r#"for=192.0.2.1, for="[2001:db8::7]:4711", for=10.0.0.2"#;
    /// assert_eq!(p.client_ip(ip("10.0.0.1"), [fwd], []), ip("2001:db8::7"));
    /// // An obfuscated hop stops the walk at the proxy that wrote it.
    /// assert_eq!(p.client_ip(ip("10.0.0.1"), ["for=_hidden"], []), ip("10.0.0.1"));
    /// // Headers that disagree: neither is believed.
    /// let xff = "192.0.2.5";
    /// assert_eq!(p.client_ip(ip("10.0.0.1"), ["for=198.51.100.1"], [xff]), ip("10.0.0.1"));
    /// assert_eq!(p.client_ip(ip("10.0.0.1"), ["for=192.0.2.5"], [xff]), ip("192.0.2.5"));
    /// ```
    pub fn client_ip<'a>(
        &self,
        peer: IpAddr,
        forwarded: impl IntoIterator<Item = &'a str>,
        x_forwarded_for: impl IntoIterator<Item = &'a str>,
    ) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.contains(peer) {
            return peer;
        }
        let present = |values: &[&str]| values.iter().any(|v| !v.trim().is_empty());
        let read = |h| self.header.is_none_or(|named| named == h);
        let forwarded: Vec<&str> = match read(ForwardingHeader::Forwarded) {
            true => forwarded.into_iter().collect(),
            false => Vec::new(),
        };
        let x_forwarded_for: Vec<&str> = match read(ForwardingHeader::XForwardedFor) {
            true => x_forwarded_for.into_iter().collect(),
            false => Vec::new(),
        };
        let by_forwarded = present(&forwarded).then(|| {
            let hops = forwarded
                .iter()
                .rev()
                .flat_map(|v| elements_rev(v))
                .filter(|element| !element.trim().is_empty())
                .map(|element| forwarded_for(element).and_then(|node| parse_node(&node)));
            self.walk(peer, hops)
        });
        let by_x_forwarded_for = present(&x_forwarded_for).then(|| {
            let hops = x_forwarded_for
                .iter()
                .rev()
                .flat_map(|v| v.rsplit(','))
                .map(str::trim)
                // RFC 9110 §5.6.1: empty list elements are to be ignored.
                .filter(|hop| !hop.is_empty())
                .map(|hop| parse_node(unquote_plain(hop)));
            self.walk(peer, hops)
        });
        match (by_forwarded, by_x_forwarded_for) {
            (Some(a), Some(b)) if a != b => peer,
            (Some(ip), _) | (None, Some(ip)) => ip,
            (None, None) => peer,
        }
    }

    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Option<IpAddr>>) -> IpAddr {
        let mut reached = peer;
        for hop in hops {
            let Some(ip) = hop else {
                return reached;
            };
            let ip = ip.to_canonical();
            if !self.contains(ip) {
                return ip;
            }
            reached = ip;
        }
        reached
    }
}

/// `::ffff:0:0/96`, the IPv4-mapped IPv6 addresses.
const MAPPED_V4: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96);

fn parse_net(entry: &str) -> Option<IpNet> {
    let net = if entry.contains('/') {
        entry.parse::<IpNet>().ok()?.trunc()
    } else {
        IpNet::from(entry.parse::<IpAddr>().ok()?)
    };
    Some(net)
}

/// An IPv4-mapped IPv6 network in IPv4 form, so that it matches canonical
/// addresses.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 && MAPPED_V4.contains(&v6.network()) => {
            match (
                v6.network().to_ipv4_mapped(),
                v6.prefix_len().checked_sub(96),
            ) {
                (Some(v4), Some(len)) => Ipv4Net::new(v4, len).map_or(net, IpNet::V4),
                _ => net,
            }
        }
        _ => net,
    }
}

/// The comma-separated elements of a `Forwarded` value, rightmost first.
///
/// Scanning from the right keeps the elements that trusted proxies appended
/// intact even when a client put an unbalanced quote further left; any
/// damage stays in the client's own elements, which the strict parse of each
/// element then refuses.
fn elements_rev(value: &str) -> Vec<&str> {
    let bytes = value.as_bytes();
    let mut out = Vec::new();
    let mut end = bytes.len();
    let mut quoted = false;
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            b'"' => {
                let backslashes = bytes[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                if !(quoted && backslashes % 2 == 1) {
                    quoted = !quoted;
                }
            }
            // Slicing next to an ASCII byte always falls on a char boundary.
            b',' if !quoted => {
                out.push(&value[i + 1..end]);
                end = i;
            }
            _ => {}
        }
    }
    out.push(&value[..end]);
    out
}

/// The `for` parameter of one `Forwarded` element; `None` if the element is
/// malformed, has no `for`, or has it twice.
fn forwarded_for(element: &str) -> Option<Cow<'_, str>> {
    let mut found = None;
    let mut rest = element;
    loop {
        // RFC 7239 has no whitespace around `;`, but some proxies write it.
        rest = rest.trim_start_matches([' ', '\t']);
        let (name, after) = rest.split_once('=')?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return None;
        }
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => unquote(quoted)?,
            None => {
                let end = after.find(';').unwrap_or(after.len());
                let value = after[..end].trim_end_matches([' ', '\t']);
                // Stricter than "token" only where it matters: `:` and `[]`
                // appear unquoted in the wild and are left for the node parser.
                if value.is_empty() || value.contains(['"', ' ', '\t', '\\']) {
                    return None;
                }
                (Cow::Borrowed(value), &after[end..])
            }
        };
        if name.eq_ignore_ascii_case("for") {
            if found.is_some() {
                return None;
            }
            found = Some(value);
        }
        let after = after.trim_start_matches([' ', '\t']);
        if after.is_empty() {
            return found;
        }
        rest = after.strip_prefix(';')?;
    }
}

/// A quoted-string body (after its opening quote): the unescaped text and
/// what follows the closing quote.
fn unquote(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let mut text = String::new();
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match (escaped, c) {
            (true, _) => {
                text.push(c);
                escaped = false;
            }
            (false, '\\') => escaped = true,
            (false, '"') => {
                let rest = &s[i + 1..];
                let raw = &s[..i];
                let text = if raw.contains('\\') {
                    Cow::Owned(text)
                } else {
                    Cow::Borrowed(raw)
                };
                return Some((text, rest));
            }
            (false, c) => text.push(c),
        }
    }
    None
}

/// An `X-Forwarded-For` entry in double quotes, as a few proxies write them.
fn unquote_plain(hop: &str) -> &str {
    hop.strip_prefix('"')
        .and_then(|h| h.strip_suffix('"'))
        .unwrap_or(hop)
}

/// A node (RFC 7239 §6) or `X-Forwarded-For` entry: an IPv4 address, an
/// IPv6 address (bracketed when it has a port), with an optional port.
/// Obfuscated identifiers, `unknown` and anything else give `None`.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    if let Some(rest) = node.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        let ip = addr.parse::<Ipv6Addr>().ok()?;
        if !after.is_empty() {
            valid_port(after.strip_prefix(':')?).then_some(())?;
        }
        return Some(IpAddr::V6(ip));
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    let (host, port) = node.rsplit_once(':')?;
    let ip = host.parse::<Ipv4Addr>().ok()?;
    valid_port(port).then_some(IpAddr::V4(ip))
}

/// `port` or `obfport` of RFC 7239 §6.
fn valid_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obf) => {
            !obf.is_empty()
                && obf
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        // RFC 7239 allows any five digits; a number above 65535 is no port.
        None => port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok(),
    }
}

/// RFC 9110 §5.6.2 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(list).unwrap()
    }

    #[test]
    fn parses_cidrs_and_bare_addresses() {
        let p = proxies(&[
            "10.0.0.0/8",
            "192.0.2.7",
            "2001:db8::/32",
            "::1",
            "172.16.5.9/12",
        ]);
        for yes in [
            "10.255.0.1",
            "192.0.2.7",
            "2001:db8:1::9",
            "::1",
            "172.31.255.255",
        ] {
            assert!(p.contains(ip(yes)), "{yes}");
        }
        for no in [
            "11.0.0.1",
            "192.0.2.8",
            "2001:db9::1",
            "::2",
            "172.32.0.0",
            "0.0.0.0",
        ] {
            assert!(!p.contains(ip(no)), "{no}");
        }
        assert!(proxies(&[]).is_empty() && TrustedProxies::none().is_empty());
        assert!(proxies(&["0.0.0.0/0"]).contains(ip("203.0.113.1")));
        assert!(!proxies(&["0.0.0.0/0"]).contains(ip("2001:db8::1")));
    }

    #[test]
    fn bad_entries_are_named() {
        for bad in [
            "",
            "x",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "10.0.0.0/",
            "fe80::1%eth0",
            "1.2.3.4:80",
            "10.0.0.0/8/8",
        ] {
            let err = TrustedProxies::parse(&["127.0.0.1", bad]).unwrap_err();
            assert_eq!(err.index, 1, "{bad}");
            assert!(err.message.contains(&format!("{bad:?}")), "{}", err.message);
        }
    }

    #[test]
    fn ipv4_mapped_addresses_compare_as_ipv4() {
        let p = proxies(&["10.0.0.0/8"]);
        assert!(p.contains(ip("::ffff:10.1.1.1")));
        let p = proxies(&["::ffff:10.0.0.0/104", "::ffff:192.0.2.1"]);
        assert!(p.contains(ip("10.9.9.9")) && p.contains(ip("::ffff:10.9.9.9")));
        assert!(p.contains(ip("192.0.2.1")) && !p.contains(ip("192.0.2.2")));
        // A v6 range that includes the mapped space includes IPv4.
        assert!(proxies(&["::/0"]).contains(ip("198.51.100.1")));
        assert!(!proxies(&["2000::/3"]).contains(ip("198.51.100.1")));
        // The client found is reported in IPv4 form.
        let p = proxies(&["10.0.0.0/8"]);
        assert_eq!(
            p.client_ip(ip("::ffff:10.0.0.1"), [], ["::ffff:203.0.113.5"]),
            ip("203.0.113.5")
        );
        assert_eq!(
            TrustedProxies::none().client_ip(ip("::ffff:203.0.113.5"), [], []),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn untrusted_peers_are_the_client() {
        let p = proxies(&["10.0.0.0/8"]);
        let peer = ip("198.51.100.4");
        assert_eq!(p.client_ip(peer, ["for=1.1.1.1"], ["2.2.2.2"]), peer);
        assert_eq!(
            TrustedProxies::none().client_ip(peer, ["for=1.1.1.1"], ["2.2.2.2"]),
            peer
        );
    }

    #[test]
    fn x_forwarded_for_is_walked_right_to_left() {
        let p = proxies(&["10.0.0.0/8", "2001:db8:ffff::/48"]);
        let peer = ip("10.0.0.1");
        let client = |xff: &[&str]| p.client_ip(peer, [], xff.iter().copied());
        // The entry left of the last trusted proxy is the client, whatever is further left.
        assert_eq!(
            client(&["6.6.6.6, 203.0.113.9, 10.0.0.2"]),
            ip("203.0.113.9")
        );
        // Several header lines form one list.
        assert_eq!(
            client(&["6.6.6.6", "203.0.113.9", "10.0.0.2, 10.0.0.3"]),
            ip("203.0.113.9")
        );
        // Ports and brackets.
        assert_eq!(client(&["203.0.113.9:5555"]), ip("203.0.113.9"));
        assert_eq!(client(&["[2001:db8::9]:443"]), ip("2001:db8::9"));
        assert_eq!(client(&["2001:db8::9"]), ip("2001:db8::9"));
        assert_eq!(client(&["\"203.0.113.9\""]), ip("203.0.113.9"));
        assert_eq!(
            client(&["203.0.113.9, 2001:db8:ffff::1"]),
            ip("203.0.113.9")
        );
        // Empty elements and blank values are ignored.
        assert_eq!(client(&[" , 203.0.113.9 ,, "]), ip("203.0.113.9"));
        // No header: the peer itself.
        assert_eq!(client(&[]), peer);
        assert_eq!(client(&["  "]), peer);
        // All trusted: the leftmost.
        assert_eq!(client(&["10.0.0.5, 10.0.0.6"]), ip("10.0.0.5"));
        // Garbage or an unknown hop stops at the nearest trusted address.
        assert_eq!(client(&["203.0.113.9, garbage, 10.0.0.6"]), ip("10.0.0.6"));
        assert_eq!(client(&["203.0.113.9, unknown"]), peer);
        assert_eq!(client(&["203.0.113.9, 10.0.0.7, 1.2.3.4:x"]), peer);
        assert_eq!(
            client(&["203.0.113.9, 2001:db8::1:80"]),
            ip("2001:db8::1:80")
        );
        assert_eq!(client(&["203.0.113.9, [2001:db8::1]:99999"]), peer);
        assert_eq!(client(&["203.0.113.9, [1.2.3.4]"]), peer);
        assert_eq!(client(&["203.0.113.9, fe80::1%eth0"]), peer);
    }

    #[test]
    fn forwarded_is_parsed_per_rfc_7239() {
        let p = proxies(&["10.0.0.0/8"]);
        let peer = ip("10.0.0.1");
        let client = |fwd: &[&str]| p.client_ip(peer, fwd.iter().copied(), []);
        assert_eq!(
            client(&["for=192.0.2.60;proto=http;by=203.0.113.43"]),
            ip("192.0.2.60")
        );
        assert_eq!(
            client(&[r#"For="[2001:db8:cafe::17]:4711""#]),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(
            client(&[r#"for="[2001:db8:cafe::17]""#]),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(client(&[r#"for="192.0.2.43:47011""#]), ip("192.0.2.43"));
        assert_eq!(client(&[r#"for="192.0.2.43:_port-1""#]), ip("192.0.2.43"));
        assert_eq!(
            client(&["for=192.0.2.43, for=198.51.100.17"]),
            ip("198.51.100.17")
        );
        assert_eq!(
            client(&["for=192.0.2.43", "for=10.0.0.3; proto=https"]),
            ip("192.0.2.43")
        );
        assert_eq!(
            client(&[r#"proto=https;for="198.51.100.17";by="\"x;y,z\"""#]),
            ip("198.51.100.17")
        );
        assert_eq!(client(&[r#"for="19\8.51.100.17""#]), ip("198.51.100.17"));
        // Blank Forwarded values are no Forwarded header.
        assert_eq!(client(&[" "]), peer);
        assert_eq!(
            p.client_ip(peer, [" ", ""], ["198.51.100.200"]),
            ip("198.51.100.200")
        );
        // Obfuscated, unknown, missing or duplicated `for`, or broken syntax:
        // stop at the proxy that wrote it.
        for stop in [
            "for=unknown",
            "for=_hidden",
            "for=\"_gazonk\"",
            "proto=https",
            "for=1.2.3.4;for=5.6.7.8",
            "for=",
            "for=\"1.2.3.4",
            "for=1.2.3.4;",
            "=1.2.3.4",
            "for 1.2.3.4",
            "for=1.2.3.4 junk",
            "for=\"1.2.3.4\"junk",
            "fo r=1.2.3.4",
            "for=a\"b",
        ] {
            assert_eq!(client(&["for=192.0.2.1", stop]), peer, "{stop:?}");
        }
        // Garbage left of the last untrusted hop is never reached.
        assert_eq!(
            client(&[r#"for="oops, for=203.0.113.5"#]),
            ip("203.0.113.5")
        );
        assert_eq!(
            client(&["for=\u{0}\u{1}, for=10.0.0.8, for=203.0.113.5"]),
            ip("203.0.113.5")
        );
        // A trusted hop left of garbage is not reached either.
        assert_eq!(
            client(&["for=203.0.113.5, for=_x, for=10.0.0.9"]),
            ip("10.0.0.9")
        );
    }

    #[test]
    fn both_headers_are_believed_only_when_they_agree() {
        let p = proxies(&["10.0.0.0/8"]);
        let peer = ip("10.0.0.1");
        // The proxy writes X-Forwarded-For; the client adds a Forwarded of
        // its own choosing, or the other way round: neither wins.
        for (fwd, xff) in [
            ("for=198.51.100.1", "192.0.2.5"),
            ("for=192.0.2.5", "198.51.100.1, 192.0.2.6"),
            ("for=192.0.2.5, for=10.0.0.2", "192.0.2.6"),
        ] {
            assert_eq!(p.client_ip(peer, [fwd], [xff]), peer, "{fwd} / {xff}");
        }
        // A proxy that keeps both up to date makes them agree.
        assert_eq!(
            p.client_ip(
                peer,
                ["for=6.6.6.6, for=192.0.2.5"],
                ["7.7.7.7", "192.0.2.5, 10.0.0.3"]
            ),
            ip("192.0.2.5")
        );
        // A header whose walk stops at the same proxy agrees with one that
        // ends there too.
        assert_eq!(
            p.client_ip(peer, ["for=_hidden, for=10.0.0.3"], ["10.0.0.3"]),
            ip("10.0.0.3")
        );
    }

    #[test]
    fn forwarded_elements_split_outside_quotes_only() {
        assert_eq!(elements_rev(r#"a="1,2",b"#), vec!["b", r#"a="1,2""#]);
        assert_eq!(elements_rev(r#"a="x\",y",b"#), vec!["b", r#"a="x\",y""#]);
        assert_eq!(elements_rev(r#"a="\\",b"#), vec!["b", r#"a="\\""#]);
        assert_eq!(elements_rev("x"), vec!["x"]);
        assert_eq!(elements_rev(""), vec![""]);
    }

    /// The reference walk over already-parsed hops, left to right.
    fn model(p: &TrustedProxies, peer: IpAddr, hops: &[Option<IpAddr>]) -> IpAddr {
        let mut reached = peer.to_canonical();
        if !p.contains(reached) {
            return reached;
        }
        for hop in hops.iter().rev() {
            match hop {
                None => return reached,
                Some(ip) if !p.contains(*ip) => return ip.to_canonical(),
                Some(ip) => reached = ip.to_canonical(),
            }
        }
        reached
    }

    fn addr() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (0u8..4).prop_map(|n| IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))),
            (0u8..4).prop_map(|n| IpAddr::V4(Ipv4Addr::new(203, 0, 113, n))),
            (0u16..4).prop_map(|n| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n))),
            (0u16..4).prop_map(|n| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n))),
            (0u8..4).prop_map(|n| IpAddr::V6(Ipv4Addr::new(10, 0, 0, n).to_ipv6_mapped())),
        ]
    }

    fn trusted() -> TrustedProxies {
        proxies(&["10.0.0.0/8", "fd00::/8"])
    }

    proptest! {
        #[test]
        fn arbitrary_headers_never_panic(
            peer in addr(),
            fwd in proptest::collection::vec(".{0,60}", 0..4),
            xff in proptest::collection::vec(".{0,60}", 0..4),
            fwd_like in proptest::collection::vec("[fFoOrR=\";,:_\\[\\] .0-9a-f\\\\]{0,40}", 0..4),
        ) {
            let p = trusted();
            let got = p.client_ip(peer, fwd.iter().map(String::as_str), xff.iter().map(String::as_str));
            let got2 = p.client_ip(peer, fwd_like.iter().map(String::as_str), xff.iter().map(String::as_str));
            // Whatever the headers say, the answer is the peer unless the
            // peer is trusted.
            if !p.contains(peer) {
                prop_assert_eq!(got, peer.to_canonical());
                prop_assert_eq!(got2, peer.to_canonical());
            }
            prop_assert_eq!(got, got.to_canonical());
        }

        #[test]
        fn untrusted_peers_always_get_themselves(
            peer in any::<IpAddr>(),
            fwd in proptest::collection::vec(".{0,40}", 0..3),
            xff in proptest::collection::vec("[0-9a-f.:, \\[\\]]{0,40}", 0..3),
        ) {
            let p = proxies(&["10.0.0.0/8"]);
            prop_assume!(!p.contains(peer));
            let got = p.client_ip(peer, fwd.iter().map(String::as_str), xff.iter().map(String::as_str));
            prop_assert_eq!(got, peer.to_canonical());
        }

        #[test]
        fn walk_matches_the_model(
            peer in addr(),
            hops in proptest::collection::vec(proptest::option::weighted(0.9, addr()), 1..6),
            ports in any::<bool>(),
            lines in any::<bool>(),
        ) {
            let p = trusted();
            let render = |hop: &Option<IpAddr>, forwarded: bool| match (hop, ports) {
                (None, _) => if forwarded { "for=unknown".to_owned() } else { "unknown".to_owned() },
                (Some(IpAddr::V4(a)), false) => if forwarded { format!("for={a}") } else { a.to_string() },
                (Some(IpAddr::V4(a)), true) => if forwarded { format!("for=\"{a}:80\"") } else { format!("{a}:80") },
                (Some(IpAddr::V6(a)), false) => if forwarded { format!("for=\"[{a}]\"") } else { a.to_string() },
                (Some(IpAddr::V6(a)), true) => if forwarded { format!("for=\"[{a}]:80\"") } else { format!("[{a}]:80") },
            };
            let join = |forwarded: bool| -> Vec<String> {
                let parts: Vec<String> = hops.iter().map(|h| render(h, forwarded)).collect();
                if lines { parts } else { vec![parts.join(", ")] }
            };
            let want = model(&p, peer, &hops);
            let xff = join(false);
            prop_assert_eq!(p.client_ip(peer, [], xff.iter().map(String::as_str)), want);
            let fwd = join(true);
            prop_assert_eq!(p.client_ip(peer, fwd.iter().map(String::as_str), []), want);
            // Both headers, saying the same: believed.
            let both = p.client_ip(peer, fwd.iter().map(String::as_str), xff.iter().map(String::as_str));
            prop_assert_eq!(both, want);
            // Saying different things: the peer, unless they name one client.
            let other = model(&p, peer, &[Some("192.0.2.99".parse().unwrap())]);
            let mixed = p.client_ip(peer, fwd.iter().map(String::as_str), ["192.0.2.99"]);
            prop_assert_eq!(mixed, if other == want { want } else { peer.to_canonical() });
        }
    }
}
