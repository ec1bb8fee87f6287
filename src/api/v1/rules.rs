//! The server's rules for a new sandbox (create and fork alike), checked in the reference's
//! order with its messages: the image allowlist, resource ranges, network permission, env names
//! and lifetime. What passes becomes a spec with every value written out.

use std::collections::BTreeMap;

use super::wire::{py_float, py_repr};
use crate::api::error::ApiError;
use crate::config::Settings;
use crate::resource::SandboxSpec;

/// Every value of a new sandbox, before the server's rules are applied.
pub struct Wanted {
    pub image: Option<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<i128>,
    pub pids_limit: Option<i128>,
    pub network: bool,
    pub read_only_rootfs: bool,
    pub env: BTreeMap<String, String>,
    pub timeout_seconds: Option<i128>,
}

/// Refuses env names the reference refuses; the message names the key even when the value is
/// the problem, as the reference's does.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(ApiError::InvalidRequest(format!(
                "invalid environment variable name {}",
                py_repr(key)
            )));
        }
    }
    Ok(())
}

/// Applies the server's defaults and rules, in the reference's order, and returns a spec with
/// every value written out (so that a later change of defaults does not change the sandbox).
pub fn resolve(settings: &Settings, wanted: Wanted) -> Result<SandboxSpec, ApiError> {
    let image = wanted
        .image
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| settings.default_image.clone());
    if !settings.image_allowed(&image) {
        return Err(ApiError::Forbidden(format!(
            "image {} is not in the server's allowed_images list",
            py_repr(&image)
        )));
    }
    let cpus = wanted.cpus.unwrap_or(settings.default_cpus);
    if cpus.is_nan() || cpus <= 0.0 || cpus > settings.max_cpus {
        return Err(ApiError::InvalidRequest(format!(
            "cpus must be in (0, {}]",
            py_float(settings.max_cpus)
        )));
    }
    if cpus < super::schemas::MIN_CPUS {
        return Err(ApiError::InvalidRequest(format!(
            "cpus must be at least {}",
            py_float(super::schemas::MIN_CPUS)
        )));
    }
    let memory_mb = in_range(
        wanted.memory_mb,
        settings.default_memory_mb,
        16,
        settings.max_memory_mb,
        "memory_mb",
    )?;
    let pids_limit = in_range(
        wanted.pids_limit,
        settings.default_pids_limit,
        8,
        settings.max_pids_limit,
        "pids_limit",
    )?;
    if wanted.network && !settings.allow_network {
        return Err(ApiError::Forbidden(
            "this server does not allow sandboxes with network access".into(),
        ));
    }
    if wanted.network && settings.egress_required && !settings.egress_by_default() {
        return Err(ApiError::Forbidden(
            "this server requires an egress policy for sandboxes with network access \
             (AGENT_SANDBOX_EGRESS_REQUIRED), and /v1 cannot carry one: create the sandbox \
             through the resource API with spec.egress"
                .into(),
        ));
    }
    check_env(&wanted.env)?;
    let ttl = in_range(
        wanted.timeout_seconds,
        settings.default_timeout_seconds,
        1,
        settings.max_timeout_seconds,
        "timeout_seconds",
    )?;
    Ok(SandboxSpec {
        image: Some(image),
        cpus: Some(cpus),
        memory_mb: Some(memory_mb),
        pids_limit: Some(pids_limit),
        network: Some(wanted.network),
        read_only_rootfs: Some(wanted.read_only_rootfs),
        env: wanted.env,
        ttl_seconds: Some(ttl),
        ..SandboxSpec::default()
    })
}

fn in_range(
    value: Option<i128>,
    default: u64,
    min: u64,
    max: u64,
    name: &str,
) -> Result<u64, ApiError> {
    let value = value.unwrap_or(i128::from(default));
    if value < i128::from(min) || value > i128::from(max) {
        return Err(ApiError::InvalidRequest(format!(
            "{name} must be in [{min}, {max}]"
        )));
    }
    Ok(value as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn wanted() -> Wanted {
        Wanted {
            image: None,
            cpus: None,
            memory_mb: None,
            pids_limit: None,
            network: false,
            read_only_rootfs: true,
            env: BTreeMap::new(),
            timeout_seconds: None,
        }
    }

    fn message(err: ApiError) -> (u16, String) {
        (err.status_and_code().0.as_u16(), err.to_string())
    }

    #[test]
    fn resolves_every_value_and_checks_in_the_reference_order() {
        let mut settings = Settings::for_tests(PathBuf::from("/tmp/x"));
        settings.allowed_images = vec!["agent-sandbox-ref-test:*".into()];
        settings.default_image = "agent-sandbox-ref-test:latest".into();
        let spec = resolve(&settings, wanted()).unwrap();
        assert_eq!(spec.image.as_deref(), Some("agent-sandbox-ref-test:latest"));
        assert_eq!(spec.cpus, Some(1.0));
        assert_eq!(spec.memory_mb, Some(512));
        assert_eq!(spec.pids_limit, Some(256));
        assert_eq!(spec.network, Some(false));
        assert_eq!(spec.read_only_rootfs, Some(true));
        assert_eq!(spec.ttl_seconds, Some(900));

        let w = Wanted {
            image: Some("python:3.12-slim".into()),
            cpus: Some(5.0),
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (
                403,
                "image 'python:3.12-slim' is not in the server's allowed_images list".into()
            )
        );
        let w = Wanted {
            cpus: Some(5.0),
            memory_mb: Some(5000),
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "cpus must be in (0, 4.0]".into())
        );
        // Docker refuses less than a hundredth of a CPU; that is the caller's mistake, not a 502.
        let w = Wanted {
            cpus: Some(0.005),
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "cpus must be at least 0.01".into())
        );
        let w = Wanted {
            memory_mb: Some(5000),
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "memory_mb must be in [16, 4096]".into())
        );
        let w = Wanted {
            pids_limit: Some(5000),
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "pids_limit must be in [8, 4096]".into())
        );
        let w = Wanted {
            timeout_seconds: Some(100_000),
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "timeout_seconds must be in [1, 86400]".into())
        );
        let mut env = BTreeMap::new();
        env.insert("A=B".to_string(), "x".to_string());
        let w = Wanted { env, ..wanted() };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "invalid environment variable name 'A=B'".into())
        );
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "x\0y".to_string());
        let w = Wanted { env, ..wanted() };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (400, "invalid environment variable name 'A'".into())
        );
        settings.egress_required = true;
        let w = Wanted {
            network: true,
            ..wanted()
        };
        let (status, text) = message(resolve(&settings, w).unwrap_err());
        assert_eq!(status, 403);
        assert!(text.contains("AGENT_SANDBOX_EGRESS_REQUIRED"), "{text}");
        settings.egress_default = vec!["pypi.org".into()];
        let w = Wanted {
            network: true,
            ..wanted()
        };
        assert!(resolve(&settings, w).is_ok());
        settings.allow_network = false;
        let w = Wanted {
            network: true,
            ..wanted()
        };
        assert_eq!(
            message(resolve(&settings, w).unwrap_err()),
            (
                403,
                "this server does not allow sandboxes with network access".into()
            )
        );
        let w = Wanted {
            image: Some(String::new()),
            ..wanted()
        };
        assert!(
            resolve(&settings, w).is_ok(),
            "an empty image means the default"
        );
    }
}
