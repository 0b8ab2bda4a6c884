use super::*;

#[test]
fn endpoints_parse_with_and_without_ports_and_prefixes() {
    let endpoint: Endpoint = "http://127.0.0.1:7070".parse().unwrap();
    assert_eq!(endpoint.url_of("/a.B/C"), "http://127.0.0.1:7070/a.B/C");
    let endpoint: Endpoint = "https://profiles.example.net/pyroscope/".parse().unwrap();
    assert_eq!((endpoint.port, endpoint.tls), (443, true));
    assert_eq!(
        endpoint.url_of("/push.v1.PusherService/Push"),
        "https://profiles.example.net/pyroscope/push.v1.PusherService/Push"
    );
    assert_eq!(
        endpoint.path_of("/push.v1.PusherService/Push"),
        "/pyroscope/push.v1.PusherService/Push"
    );
    let endpoint: Endpoint = "http://[::1]:4040".parse().unwrap();
    assert_eq!((endpoint.host.as_str(), endpoint.port), ("::1", 4040));
    assert_eq!(endpoint.to_string(), "http://[::1]:4040");
}

#[test]
fn bad_endpoints_say_why() {
    for (url, expected) in [
        ("ftp://x", "http:// or https://"),
        ("http://user:pw@host", "credentials"),
        ("http://host:0", "HOST[:PORT]"),
        ("http://host:99999", "HOST[:PORT]"),
        ("http://", "HOST[:PORT]"),
        ("http://h/p?q=1", "no query"),
        ("http://ho st", "HOST[:PORT]"),
    ] {
        let err = url.parse::<Endpoint>().unwrap_err();
        assert!(
            err.contains(expected),
            "{url}: expected an error about {expected}, got {err}"
        );
    }
}

#[test]
fn target_specs_name_a_backend() {
    let spec: TargetSpec = "parca=http://localhost:7070".parse().unwrap();
    assert_eq!(spec.backend, Backend::Parca);
    assert!(
        "tempo=http://x"
            .parse::<TargetSpec>()
            .unwrap_err()
            .contains("pyroscope or parca")
    );
    assert!(
        "http://x"
            .parse::<TargetSpec>()
            .unwrap_err()
            .contains("BACKEND=URL")
    );
}

#[test]
fn extra_labels_follow_the_label_name_rule() {
    assert!("env=prod".parse::<ExtraLabel>().is_ok());
    for bad in ["1x=a", "a-b=c", "__x=y", "service_name=x", "x=", "=x"] {
        assert!(bad.parse::<ExtraLabel>().is_err(), "{bad} should be refused");
    }
}

#[test]
fn auth_settings_go_together() {
    let section = |user: Option<&str>, password: Option<&str>, token: Option<&str>| TargetSection {
        backend: Backend::Pyroscope,
        url: "https://x".into(),
        tenant: None,
        basic_auth_user: user.map(Into::into),
        basic_auth_password_file: password.map(Into::into),
        bearer_token_file: token.map(Into::into),
        ca_file: None,
    };
    assert!(matches!(
        section(Some("u"), Some("/p"), None).resolve().unwrap().auth,
        Auth::Basic { .. }
    ));
    assert!(matches!(
        section(None, None, Some("/t")).resolve().unwrap().auth,
        Auth::Bearer { .. }
    ));
    assert!(section(Some("u"), None, None).resolve().is_err());
    assert!(section(Some("u"), Some("/p"), Some("/t")).resolve().is_err());
}
