//! How numbers are written in JSON output: limits as people write them.

/// Whole numbers print without a fraction (`20`, not `20.0`).
pub fn number<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        s.serialize_i64(*x as i64)
    } else {
        s.serialize_f64(*x)
    }
}

/// [`number`], or `null`.
pub fn optional_number<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => number(v, s),
        None => s.serialize_none(),
    }
}
