//! The dev CA: issuing, loading, and the errors an operator meets.

use muster_tls::{
    AGENT_NAME, CaError, Role, SERVER_NAME, TlsError, TlsMaterial, Validity, cert_file_names, cert_has_dns_name,
    init_ca, issue, role_of_cert,
};
use time::{Duration, OffsetDateTime};

#[test]
fn issued_certificates_carry_their_role_and_load_for_it() {
    let dir = tempfile::tempdir().unwrap();
    init_ca(dir.path(), "test", Validity::days(10)).unwrap();
    for role in [Role::Server(1), Role::Agent("gpu-07".into()), Role::Admin("alice".into())] {
        issue(dir.path(), &role, Validity::days(1), &[]).unwrap();
        let m = TlsMaterial::load(dir.path(), &role).unwrap();
        assert_eq!(m.role, role);
    }
    issue(dir.path(), &Role::Server(2), Validity::days(1), &["10.0.0.2".into(), "replica-2.example".into()]).unwrap();
    let pem = std::fs::read(dir.path().join("server-2.pem")).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    assert_eq!(role_of_cert(&pem.contents).unwrap(), Role::Server(2));
    assert_eq!(cert_file_names(dir.path()), ["admin-alice", "agent-gpu-07", "server-1", "server-2"]);
    // Servers are verified by SERVER_NAME, agents (serving each other
    // checkpoints) by AGENT_NAME; an admin serves nothing.
    let pem_of = |stem: &str| std::fs::read_to_string(dir.path().join(format!("{stem}.pem"))).unwrap();
    assert!(cert_has_dns_name(&pem_of("server-1"), SERVER_NAME) && !cert_has_dns_name(&pem_of("server-1"), AGENT_NAME));
    assert!(cert_has_dns_name(&pem_of("agent-gpu-07"), AGENT_NAME));
    assert!(!cert_has_dns_name(&pem_of("admin-alice"), AGENT_NAME) && !cert_has_dns_name("not a pem", AGENT_NAME));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca-key.pem")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the CA key is private");
        let mode = std::fs::metadata(dir.path().join("server-1-key.pem")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The only admin certificate is the CLI's default identity.
    assert_eq!(TlsMaterial::load_for_client(dir.path(), None).unwrap().role, Role::Admin("alice".into()));
    issue(dir.path(), &Role::Admin("bob".into()), Validity::days(1), &[]).unwrap();
    let err = TlsMaterial::load_for_client(dir.path(), None).unwrap_err().to_string();
    assert!(err.contains("admin-alice, admin-bob") && err.contains("--identity"), "{err}");
    assert_eq!(TlsMaterial::load_for_client(dir.path(), Some("admin-bob")).unwrap().role, Role::Admin("bob".into()));
}

#[test]
fn mistakes_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = issue(dir.path(), &Role::Server(1), Validity::days(1), &[]).unwrap_err();
    assert!(matches!(err, CaError::NoCa(_)), "{err}");
    assert!(err.to_string().contains("muster tls init"), "{err}");
    init_ca(dir.path(), "test", Validity::days(10)).unwrap();
    let err = init_ca(dir.path(), "again", Validity::days(10)).unwrap_err();
    assert!(matches!(err, CaError::CaExists(_)), "{err}");
    assert!(matches!(
        issue(dir.path(), &Role::Server(1), Validity::days(1), &["not a name!".into()]),
        Err(CaError::BadName(_))
    ));

    // A certificate copied under another role's name is refused.
    issue(dir.path(), &Role::Agent("a".into()), Validity::days(1), &[]).unwrap();
    std::fs::copy(dir.path().join("agent-a.pem"), dir.path().join("agent-b.pem")).unwrap();
    std::fs::copy(dir.path().join("agent-a-key.pem"), dir.path().join("agent-b-key.pem")).unwrap();
    let err = TlsMaterial::load(dir.path(), &Role::Agent("b".into())).unwrap_err();
    assert!(matches!(err, TlsError::WrongRole { .. }), "{err}");
    assert!(err.to_string().contains("is for agent a, not agent b"), "{err}");

    // An expired one, and a missing one.
    let now = OffsetDateTime::now_utc();
    let expired = Validity { not_before: now - Duration::days(10), not_after: now - Duration::days(1) };
    issue(dir.path(), &Role::Admin("old".into()), expired, &[]).unwrap();
    let err = TlsMaterial::load(dir.path(), &Role::Admin("old".into())).unwrap_err();
    assert!(matches!(err, TlsError::NotValidNow { .. }), "{err}");
    assert!(err.to_string().contains("muster tls issue"), "{err}");
    let err = TlsMaterial::load(dir.path(), &Role::Server(9)).unwrap_err();
    assert!(err.to_string().contains("server-9.pem"), "{err}");
}
