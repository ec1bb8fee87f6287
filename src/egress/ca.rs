//! The gateway's own certificate authority, for HTTPS to the hosts of a sandbox's Secrets (the
//! only connections the gateway opens up; every other tunnel stays end to end). Made once and
//! kept by the store (the key owner-only); leaf certificates for each host are made on first use
//! and kept in memory. Also the client side: upstream TLS is verified against the host's roots
//! (its CA bundle, else Mozilla's list) plus `AGENT_SANDBOX_EGRESS_EXTRA_CA`. Keys are never
//! logged or put in an error.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::store::Store;

pub use crate::docker::CA_MOUNT;
/// The host bundles tried, in order, for the roots sandboxes and the gateway trust.
const HOST_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];
/// Leaf configurations kept; beyond this the cache starts over (they are cheap to make).
const MAX_LEAVES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("egress CA: {0}")]
    Certificate(String),
    #[error("egress CA: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("AGENT_SANDBOX_EGRESS_EXTRA_CA {path}: {reason}")]
    ExtraCa { path: String, reason: String },
}

fn cert_error(e: impl std::fmt::Display) -> CaError {
    CaError::Certificate(e.to_string())
}

/// The authority, and the TLS configurations made with it.
pub struct Authority {
    issuer: rcgen::Certificate,
    key: KeyPair,
    issuer_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    client: Arc<rustls::ClientConfig>,
    public_dir: std::path::PathBuf,
}

/// The authority's fixed shape: a certificate made again from it and the kept key issues leaves
/// that chain to the kept certificate (same name, same key).
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "agent-sandbox egress CA");
    name.push(DnType::OrganizationName, "agent-sandbox");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2125, 1, 1);
    params
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl std::fmt::Debug for Authority {
    /// Names the public directory only: nothing of the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("public_dir", &self.public_dir)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// The kept authority, or a new one kept now; writes the public files sandboxes read.
    pub fn load_or_create(store: &Store, extra_ca: Option<&Path>) -> Result<Authority, CaError> {
        let (cert_pem, key) = match store.egress_ca() {
            Some((cert, key)) => (cert, KeyPair::from_pem(&key).map_err(cert_error)?),
            None => {
                let key = KeyPair::generate().map_err(cert_error)?;
                let cert = ca_params().self_signed(&key).map_err(cert_error)?;
                store.set_egress_ca(&cert.pem(), &key.serialize_pem())?;
                tracing::info!("egress: made the gateway's certificate authority");
                (cert.pem(), key)
            }
        };
        let issuer = ca_params().self_signed(&key).map_err(cert_error)?;
        let issuer_der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(cert_error)?;
        let host_bundle = HOST_BUNDLES
            .iter()
            .find_map(|path| std::fs::read_to_string(path).ok());
        let mut roots = rustls::RootCertStore::empty();
        match &host_bundle {
            Some(bundle) => {
                let certs = CertificateDer::pem_slice_iter(bundle.as_bytes()).flatten();
                roots.add_parsable_certificates(certs);
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        if let Some(path) = extra_ca {
            let extra_error = |reason: String| CaError::ExtraCa {
                path: path.display().to_string(),
                reason,
            };
            let text = std::fs::read(path).map_err(|e| extra_error(e.to_string()))?;
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&text)
                .collect::<Result<_, _>>()
                .map_err(|e| extra_error(e.to_string()))?;
            if certs.is_empty() {
                return Err(extra_error("no PEM certificate in it".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| extra_error(e.to_string()))?;
            }
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(cert_error)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut bundle = host_bundle.unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&cert_pem);
        let public_dir = store.set_egress_ca_public(&cert_pem, &bundle)?;
        Ok(Authority {
            issuer,
            key,
            issuer_der,
            leaves: Mutex::default(),
            client: Arc::new(client),
            public_dir,
        })
    }

    /// The directory to mount read-only at [`CA_MOUNT`] in policed sandboxes.
    pub fn public_dir(&self) -> &Path {
        &self.public_dir
    }

    /// The variables that make a sandbox's clients trust the bundle (the host's roots and this
    /// authority) at [`CA_MOUNT`].
    pub fn env() -> Vec<(String, String)> {
        let bundle = format!("{CA_MOUNT}/bundle.pem");
        let mut env: Vec<(String, String)> = [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "PIP_CERT",
        ]
        .iter()
        .map(|k| (k.to_string(), bundle.clone()))
        .collect();
        // Node adds these to its own roots.
        env.push(("NODE_EXTRA_CA_CERTS".into(), format!("{CA_MOUNT}/ca.pem")));
        env
    }

    /// The server side of an intercepted connection to `host`: a leaf for it, issued now or
    /// earlier.
    pub(super) fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(Arc::clone(config));
        }
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(cert_error)?;
        params
            .distinguished_name
            .push(DnType::CommonName, host.to_string());
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2125, 1, 1);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(cert_error)?;
        let chain = vec![leaf.der().clone(), self.issuer_der.clone()];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(cert_error)?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(cert_error)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), Arc::clone(&config));
        Ok(config)
    }

    /// The client side towards upstreams, verifying them.
    pub(super) fn client_config(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.client)
    }
}
