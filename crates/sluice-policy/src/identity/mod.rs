//! Who a request comes from, as the policy's keys need it: the client's
//! address (from the socket, or from a forwarding header that a trusted
//! proxy set) and the claims of a JWT that the policy's keys verify. Both
//! are read from what a front end hands over ([`crate::Request`]); neither
//! reads a socket or makes a network call, JWKS files included.

pub(crate) mod client_ip;
pub(crate) mod jwt;
