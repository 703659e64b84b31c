//! Reading a state's bytes: what `states` and the states it is made of
//! (a sliding log, a key's leases) decode with, in a room of its own so
//! that they need not import each other.

/// Reads little-endian numbers off the front of a state's bytes.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    pub(crate) fn f64(&mut self) -> Option<f64> {
        self.take().map(f64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }

    pub(crate) fn left(&self) -> usize {
        self.0.len()
    }
}
