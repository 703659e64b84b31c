//! Loading a policy: reading its file (size-capped), parsing the YAML or
//! JSON with positions, and compiling it into a [`Policy`].

use std::path::{Path, PathBuf};

use crate::error::{PolicyError, from_yaml};
use crate::policy::Policy;
use crate::schema::RawPolicy;

impl Policy {
    /// Reads, parses and validates a policy file (YAML, or JSON).
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let err = Policy::from_path("/nonexistent/policy.yaml".as_ref()).unwrap_err();
    /// assert!(err.to_string().starts_with("/nonexistent/policy.yaml: cannot read"));
    /// ```
    pub fn from_path(path: &Path) -> Result<Policy, PolicyError> {
        Policy::from_str(&Policy::read(path)?, path)
    }

    /// Reads a policy file's text, refusing anything but a regular file of
    /// at most [`MAX_POLICY_BYTES`](crate::MAX_POLICY_BYTES).
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let err = Policy::read("/dev/zero".as_ref()).unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "/dev/zero: cannot read the policy file: a character device, not a regular file"
    /// );
    /// ```
    pub fn read(path: &Path) -> Result<String, PolicyError> {
        crate::files::read_text_capped(path, crate::files::MAX_POLICY_BYTES).map_err(|e| {
            PolicyError {
                file: path.to_owned(),
                line: 0,
                column: 0,
                message: format!("cannot read the policy file: {e}"),
            }
        })
    }

    /// Parses and validates policy text; `file` names it in errors.
    ///
    /// JSON is accepted as well as YAML: a JSON document is a YAML one.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let p = Policy::from_str(r#"{"on_store_error": "closed"}"#, "p.json").unwrap();
    /// assert!(p.rules().is_empty());
    /// let err = Policy::from_str("rules:\n  - name: a\n    limit_keys: []\n    algorithm: token_bucket\n    algorithm_config: {rps: -1}\n", "p.yaml").unwrap_err();
    /// assert_eq!(err.to_string(), "p.yaml:5:29: `rps` must be a positive number, got -1");
    /// ```
    pub fn from_str(text: &str, file: impl AsRef<Path>) -> Result<Policy, PolicyError> {
        let file: PathBuf = file.as_ref().to_owned();
        let options = serde_saphyr::options! {
            with_snippet: false,
            strict_booleans: true,
        };
        let raw: RawPolicy = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| from_yaml(&e, file.clone()))?;
        let (mut policy, warnings) =
            crate::compile::compile(raw, &file).map_err(|e| e.into_error(file.clone()))?;
        policy.warnings = warnings
            .into_iter()
            .map(|w| w.into_warning(file.clone()))
            .collect();
        Ok(policy)
    }
}
