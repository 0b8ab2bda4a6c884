use clap::{CommandFactory, FromArgMatches};

use super::*;
use crate::cli::Cli;

fn daemon_args(argv: &[&str]) -> (DaemonArgs, ArgMatches) {
    let matches = Cli::command().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).expect("valid arguments");
    (cli.daemon, matches)
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("profilerd-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

#[test]
fn an_unknown_key_is_named_at_its_line() {
    let err = Config::parse("frequency = 99\nfrequncy = 5\n", "test.toml").expect_err("typo must fail");
    let message = err.to_string();
    assert!(
        message.starts_with("test.toml:2: unknown field `frequncy`"),
        "{message}"
    );
    assert!(message.contains("`frequency`"), "lists the known keys: {message}");
    assert!(!message.contains('\n'), "one line: {message}");
}

#[test]
fn a_value_of_the_wrong_type_is_named_with_its_key_and_line() {
    let err = Config::parse("# comment\nfrequency = \"fast\"\n", "t.toml").expect_err("a string is no Hz");
    let message = err.to_string();
    assert!(message.starts_with("t.toml:2: frequency: "), "{message}");
    let err = Config::parse("listen = \"nowhere\"\n", "t.toml").expect_err("a bad address must fail");
    assert!(err.to_string().starts_with("t.toml:1: listen: "), "{err}");
    let err = Config::parse("store_max_mb = -1\n", "t.toml").expect_err("negative");
    assert!(err.to_string().starts_with("t.toml:1: store_max_mb: "), "{err}");
}

#[test]
fn a_value_out_of_range_is_named_with_its_range_and_line() {
    let err = Config::parse("\nfrequency = 0\n", "t.toml").expect_err("0 Hz must fail");
    assert_eq!(
        err.to_string(),
        "t.toml:2: frequency = 0 is out of range; expected 1 to 10000"
    );
    let err = Config::parse("counts_map_entries = 99999999\n", "t.toml").expect_err("too big");
    assert!(
        err.to_string()
            .starts_with("t.toml:1: counts_map_entries = 99999999 is out of range"),
        "{err}"
    );
}

#[test]
fn a_syntax_error_names_the_line() {
    let err = Config::parse("frequency = 99\nretention_seconds =\n", "t.toml").expect_err("no value");
    assert!(err.to_string().starts_with("t.toml:2: "), "{err}");
}

#[test]
fn the_key_ranges_are_the_flags_ranges() {
    for (key, range) in RANGES {
        let flag = format!("--{}", key.replace('_', "-"));
        let accepts = |value: u64| {
            Cli::command()
                .try_get_matches_from(["profilerd", flag.as_str(), &value.to_string()])
                .is_ok()
        };
        assert!(
            accepts(*range.start()) && accepts(*range.end()),
            "{flag} {range:?}"
        );
        assert!(
            !accepts(range.start() - 1) && !accepts(range.end() + 1),
            "{flag} should reject values outside {range:?}"
        );
    }
}

#[test]
fn the_push_key_ranges_are_the_flags_ranges() {
    for (key, _, range) in crate::push::settings::PushSection::default().numbers() {
        let flag = format!("--{}", key.replace(['.', '_'], "-"));
        let accepts = |value: u64| {
            Cli::command()
                .try_get_matches_from(["profilerd", flag.as_str(), &value.to_string()])
                .is_ok()
        };
        assert!(
            accepts(*range.start()) && accepts(*range.end()),
            "{flag} {range:?}"
        );
        assert!(
            !accepts(range.start() - 1) && !accepts(range.end() + 1),
            "{flag} should reject values outside {range:?}"
        );
    }
}

#[test]
fn every_daemon_flag_has_a_key() {
    let keys: Vec<&str> = RANGES.iter().map(|(key, _)| *key).chain(OTHER_KEYS).collect();
    let command = Cli::command();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if ["config", "help", "version"].contains(&id) {
            continue;
        }
        // A switch that is on by default is turned off by its negation.
        let id = id.strip_prefix("no_").unwrap_or(id);
        if id.starts_with("push") {
            assert!(
                crate::push::flags::FLAG_KEYS.iter().any(|(flag, _)| *flag == id),
                "flag --{id} has no [push] key"
            );
            continue;
        }
        assert!(keys.contains(&id), "flag --{id} has no config key");
    }
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let config = Config::parse(
        "frequency = 199\nretention_seconds = 600\nlisten = \"127.0.0.1:9000\"\nuser_stack_map_entries = 1024\n",
        "t",
    )
    .expect("valid");
    let (mut args, matches) = daemon_args(&["profilerd", "--frequency", "49", "--listen", "127.0.0.1:1"]);
    config.apply(&mut args, &matches);
    assert_eq!(args.sampling.frequency, 49, "the flag wins");
    assert_eq!(args.listen.to_string(), "127.0.0.1:1", "the flag wins");
    assert_eq!(args.retention_seconds, 600, "the file beats the default");
    assert_eq!(args.sampling.user_stack_map_entries, 1024);
    assert_eq!(args.store_max_mb, 64, "untouched keys keep their default");
}

#[test]
fn a_flag_given_with_its_default_value_still_wins() {
    // clap knows the flag was typed even when its value equals the default.
    let config = Config::parse("frequency = 199\n", "t").expect("valid");
    let (mut args, matches) = daemon_args(&["profilerd", "--frequency", "99"]);
    config.apply(&mut args, &matches);
    assert_eq!(args.sampling.frequency, 99);
}

#[test]
fn without_a_file_the_defaults_apply() {
    let dir = scratch_dir("defaults");
    let (mut args, matches) = daemon_args(&["profilerd"]);
    let used = apply_file(&mut args, &matches, &dir.join("absent.toml")).expect("no file is fine");
    assert_eq!(used, None);
    assert_eq!(
        describe(&args),
        "listen = \"127.0.0.1:7040\"\nretention_seconds = 300\nstore_max_mb = 64\nstore_user_share_percent = 50\nfrequency = 99\n\
         drain_interval_ms = 1000\ncounts_map_entries = 16384\nuser_stack_map_entries = 16384\n\
         kernel_stack_map_entries = 8192\nmax_open_files = 1024\nsymbolizer_memory_mb = 1024\n\
         symbolizer_deadline_ms = 5000\ndebug_file_lines = false\nunwind = \"auto\"\nunwind_table_memory_mb = 64\nunwind_table_user_share_percent = 50\noff_cpu = false\noff_cpu_sample_every = 1\noff_cpu_budget = 1000\noff_cpu_min_us = 0\npython_frames = true\nproc_root = \"/proc\"\nalloc_sample_bytes = 524288\nalloc_max_processes = 4\nalloc_budget_percent = 10\nalloc_trace_comms = []\nalloc_trace_units = []\nalloc_trace_pids = []\nhttp_max_connections = 512\nhttp_header_timeout_ms = 5000\n\
         http_idle_timeout_seconds = 60\nscrape_concurrency = 2\nscrape_queue = 16\nscrape_memory_mb = 32\nscrape_share_ms = 250\naccess_group = \"profilerd\"\naccess_token_file = \"\"\ninsecure = false\n\
         tls_cert_file = \"\"\ntls_key_file = \"\"\ntls_client_ca_file = \"\"\n\
         \n[push]\ninterval_seconds = 15\ntimeout_seconds = 10\nspool_kb = 65536\nspool_dir = \"\"\nlabels = {  }\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_file_is_used_when_present_and_an_explicit_missing_one_is_an_error() {
    let dir = scratch_dir("files");
    let default = dir.join("profilerd.toml");
    std::fs::write(&default, "frequency = 49\n").expect("writing the config");
    let (mut args, matches) = daemon_args(&["profilerd"]);
    let used = apply_file(&mut args, &matches, &default).expect("valid file");
    assert_eq!(used.as_deref(), Some(default.as_path()));
    assert_eq!(args.sampling.frequency, 49);

    let missing = dir.join("missing.toml");
    let argv = ["profilerd", "--config", missing.to_str().expect("utf-8 path")];
    let (mut args, matches) = daemon_args(&argv);
    let err = apply_file(&mut args, &matches, &default).expect_err("an explicit file must exist");
    assert!(
        matches!(err, ConfigError::Read { .. }) && err.to_string().contains("missing.toml"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_config_output_parses_back_to_the_same_settings() {
    let (args, _) = daemon_args(&["profilerd", "--frequency", "199"]);
    let config = Config::parse(&describe(&args), "described").expect("describe writes valid TOML");
    assert_eq!(config.frequency, Some(199));
    assert_eq!(config.listen, Some(args.listen.clone()));
}

#[test]
fn the_shipped_default_config_is_valid_and_documents_every_key() {
    let text = include_str!("../../../deploy/profilerd.toml");
    let config = Config::parse(text, "deploy/profilerd.toml").expect("the shipped config parses");
    assert_eq!(config, Config::default(), "every key is commented out");
    let (defaults, _) = daemon_args(&["profilerd"]);
    // Each documented default is the real one: uncommenting them all changes nothing.
    // The [push] tables come last; their keys are documented, not defaults.
    let (keys_part, push_part) = text.split_once("# [push]").expect("a commented [push] example");
    for (_, key) in crate::push::flags::FLAG_KEYS {
        let key = key.strip_prefix("targets.").unwrap_or(key);
        let documented = if key == "targets" {
            push_part.contains("# [[push.targets]]")
        } else {
            push_part.contains(&format!("# {key} ="))
        };
        assert!(documented, "deploy/profilerd.toml should document [push] {key}");
    }
    let uncommented: String = keys_part
        .lines()
        .map(|line| {
            line.strip_prefix("# ")
                .filter(|rest| rest.contains(" = "))
                .unwrap_or("")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let (mut args, matches) = daemon_args(&["profilerd"]);
    Config::parse(&uncommented, "uncommented")
        .expect("the documented defaults parse")
        .apply(&mut args, &matches);
    assert_eq!(describe(&args), describe(&defaults));
    for key in RANGES.iter().map(|(key, _)| *key).chain(OTHER_KEYS) {
        assert!(
            text.contains(&format!("# {key} =")),
            "deploy/profilerd.toml should document {key}"
        );
    }
}

#[test]
fn the_push_section_sets_what_no_flag_gave() {
    let text = "retention_seconds = 300\n\n[push]\ninterval_seconds = 30\nspool_kb = 8192\nlabels = { env = \"prod\" }\n\n\
                [[push.targets]]\nbackend = \"parca\"\nurl = \"http://127.0.0.1:7070\"\n\n\
                [[push.targets]]\nbackend = \"pyroscope\"\nurl = \"https://p.example.net\"\ntenant = \"t1\"\n\
                basic_auth_user = \"42\"\nbasic_auth_password_file = \"/etc/profilerd/p\"\n";
    let config = Config::parse(text, "t").expect("valid");
    let (mut args, matches) = daemon_args(&["profilerd", "--push-interval-seconds", "20"]);
    config.apply(&mut args, &matches);
    let settings = args
        .push
        .settings(std::time::Duration::from_secs(300))
        .expect("valid settings");
    assert_eq!(settings.interval.as_secs(), 20, "the flag wins");
    assert_eq!(settings.spool_bytes, 8 << 20);
    assert_eq!(settings.targets.len(), 2);
    assert_eq!(settings.targets[1].tenant.as_deref(), Some("t1"));
    assert_eq!(settings.labels[0].name, "env");
    // What check-config prints is a config that gives the same settings.
    let printed = describe(&args);
    let reparsed = Config::parse(&printed, "printed").expect("check-config prints valid config");
    let (mut again, matches) = daemon_args(&["profilerd"]);
    reparsed.apply(&mut again, &matches);
    assert_eq!(
        again
            .push
            .settings(std::time::Duration::from_secs(300))
            .unwrap()
            .targets,
        settings.targets
    );
}

#[test]
fn push_flags_replace_the_files_targets() {
    let config = Config::parse(
        "[[push.targets]]\nbackend = \"parca\"\nurl = \"http://a:7070\"\n",
        "t",
    )
    .unwrap();
    let (mut args, matches) = daemon_args(&["profilerd", "--push", "pyroscope=http://b:4040"]);
    config.apply(&mut args, &matches);
    let settings = args.push.settings(std::time::Duration::from_secs(300)).unwrap();
    let names: Vec<_> = settings.targets.iter().map(|target| target.name()).collect();
    assert_eq!(names, vec!["pyroscope http://b:4040"]);
}

#[test]
fn bad_push_sections_are_refused_with_a_reason() {
    for (text, expected) in [
        (
            "[push]\ninterval_seconds = 0\n",
            "push.interval_seconds = 0 is out of range",
        ),
        ("[push]\nlabels = { service_name = \"x\" }\n", "service_name"),
        (
            "[[push.targets]]\nbackend = \"parca\"\nurl = \"parca:7070\"\n",
            "http:// or https://",
        ),
        (
            "[[push.targets]]\nbackend = \"tempo\"\nurl = \"http://x\"\n",
            "tempo",
        ),
        ("[push]\nfrequency = 9\n", "frequency"),
    ] {
        let err = Config::parse(text, "t").expect_err(text).to_string();
        assert!(
            err.contains(expected),
            "{text:?}: expected an error about {expected:?}, got {err}"
        );
    }
    let config = Config::parse(
        "[push]\ninterval_seconds = 300\n[[push.targets]]\nbackend = \"parca\"\nurl = \"http://a\"\n",
        "t",
    )
    .unwrap();
    let (mut args, matches) = daemon_args(&["profilerd"]);
    config.apply(&mut args, &matches);
    let err = args
        .push
        .settings(std::time::Duration::from_secs(300))
        .unwrap_err();
    assert!(err.contains("retention"), "{err}");
}
