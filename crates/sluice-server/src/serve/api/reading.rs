//! Reading a call's body: bounded, JSON only, parsed with the field that failed named.

use super::*;

/// Reads a whole request body of at most [`MAX_BODY`] bytes. A body that
/// arrives in one piece, as a call's JSON does, is passed on without a copy
/// or the buffer list that collecting a body in general needs. A body that
/// misses the server's body timeout is a 408.
// The error is the response that ends the request; boxing it buys nothing.
#[allow(clippy::result_large_err)]
pub(super) async fn read_body(mut body: Body) -> Result<Bytes, Response> {
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_BODY} bytes"),
        )
    };
    if hyper::body::Body::size_hint(&body).lower() > MAX_BODY as u64 {
        return Err(too_large());
    }
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match crate::serve::body::BodyTimedOut::in_chain(&e) {
            Some(late) => problem(StatusCode::REQUEST_TIMEOUT, late.to_string()),
            None => problem(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            ),
        })?;
        // Trailers carry nothing a call reads.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let held = joined.as_ref().map_or(first.len(), BytesMut::len);
        if held + data.len() > MAX_BODY {
            return Err(too_large());
        }
        match &mut joined {
            Some(buf) => buf.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut buf = BytesMut::with_capacity(held + data.len());
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// Reads a body that `headers` must announce as JSON (a 415 otherwise: see
/// [`is_json`]), as [`read_body`] does.
#[allow(clippy::result_large_err)]
pub(super) async fn json_body(headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    if !is_json(headers) {
        return Err(not_json(headers));
    }
    read_body(body).await
}

/// Reads a request's JSON body, turning every way it can be wrong into a
/// problem.
#[allow(clippy::result_large_err)]
pub(super) async fn json<T: serde::de::DeserializeOwned>(req: Request) -> Result<T, Response> {
    let (parts, body) = req.into_parts();
    parse(&json_body(&parts.headers, body).await?)
}

/// Parses a JSON body that `T` may borrow strings from.
#[allow(clippy::result_large_err)]
pub(super) fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes)
        .map_err(|e| problem(StatusCode::BAD_REQUEST, format!("malformed JSON body: {e}")))
}
