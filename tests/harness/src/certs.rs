//! Certificates for one control plane: a throwaway CA, the API server's
//! serving certificate, an admin client certificate and the service-account
//! signing key.
//!
//! Everything is generated fresh for each control plane and lives only in its
//! data directory. The admin identity is a client certificate in the
//! `system:masters` group, the way envtest provisions its admin: RBAC is on
//! (so RBAC objects behave as in a cluster) and the tests still hold every
//! permission.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::HarnessError;

/// PEM material for one control plane.
pub struct Certificates {
    /// The CA every other certificate chains to; also the client CA.
    pub ca_cert: String,
    /// The API server's serving certificate (`localhost`, `127.0.0.1`).
    pub serving_cert: String,
    /// Its private key.
    pub serving_key: String,
    /// The admin client certificate (`system:masters`).
    pub admin_cert: String,
    /// Its private key.
    pub admin_key: String,
    /// The service-account token signing key (private).
    pub service_account_key: String,
    /// Its public half, which the API server verifies tokens with.
    pub service_account_public: String,
}

impl Certificates {
    /// Generates a fresh set.
    pub fn generate() -> Result<Self, HarnessError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name = name("arcwright-test-ca", None);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec!["localhost".to_owned()])?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving.distinguished_name = name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name = name("arcwright-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let service_account = KeyPair::generate()?;

        Ok(Self {
            ca_cert: ca_cert.pem(),
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            service_account_key: service_account.serialize_pem(),
            service_account_public: service_account.public_key_pem(),
        })
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}
