use super::*;

fn args(a: &[&str]) -> Vec<OsString> {
    std::iter::once("gateway")
        .chain(a.iter().copied())
        .map(OsString::from)
        .collect()
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

fn file_errors(text: &str) -> Vec<String> {
    let f = file(text);
    match load(args(&["--config", f.path().to_str().unwrap()])) {
        Err(Failure::File(e)) => e,
        other => panic!("{text}: {other:?}"),
    }
}

#[test]
fn every_flag_has_a_table_and_every_table_has_flags_and_variables_are_unique() {
    let cmd = command();
    let flags: Vec<&str> = cmd
        .get_arguments()
        .filter(|a| is_flag(a) && a.get_id() != "config")
        .map(|a| a.get_long().unwrap())
        .collect();
    assert!(flags.len() > 70, "{}", flags.len());
    for (table, _) in GROUPS {
        assert!(
            flags.iter().any(|f| group_of(f) == table),
            "[{table}] is empty"
        );
    }
    let mut envs: Vec<String> = flags.iter().map(|f| env_name(f)).collect();
    envs.sort();
    envs.dedup();
    assert_eq!(envs.len(), flags.len());
    assert_eq!(group_of("jwt-issuer"), "auth");
    assert_eq!(group_of("data-dir"), "storage");
    assert_eq!(group_of("header-bytes-max"), "limits");
    assert_eq!(env_name("data-dir"), "GATEWAY_DATA_DIR");
}

#[test]
fn the_command_line_wins_over_the_file_which_wins_over_the_default() {
    let f = file(
        "[listener]\ncores = 3\ncors-allow-origin = [\"https://a.example\"]\n\
         no-tx-timestamps = true\n[storage]\nfsync = \"never\"\n[limits]\n\
         event-bytes-max = 1000\n",
    );
    let path = f.path().to_str().unwrap();
    let l = load(args(&["--config", path, "--cores", "2"])).unwrap();
    assert_eq!(l.cfg.cores, 2);
    assert_eq!(l.cfg.fsync.as_deref(), Some("never"));
    assert_eq!(l.cfg.event_bytes_max, 1000);
    assert!(l.cfg.no_tx_timestamps);
    assert_eq!(l.cfg.cors_allow_origins, ["https://a.example"]);
    assert_eq!(l.cfg.header_bytes_max, 8 * 1024, "a default");
    let d = describe(&l);
    assert!(d.contains("cores = 2  # command line"), "{d}");
    assert!(d.contains("fsync = \"never\"  # file"), "{d}");
    assert!(d.contains("header-bytes-max = 8192  # default"), "{d}");
    // A repeatable flag on the command line replaces the file's list.
    let l = load(args(&[
        "--config",
        path,
        "--cors-allow-origin",
        "https://b.example",
    ]))
    .unwrap();
    assert_eq!(l.cfg.cors_allow_origins, ["https://b.example"]);
}

#[test]
fn file_errors_name_the_file_and_the_key() {
    let e = file_errors("[listener]\nlisen = \"127.0.0.1:1\"\n");
    assert!(e[0].contains("[listener] lisen: not a flag"), "{e:?}");
    let e = file_errors("[limits]\nevent-bytes-max = \"lots\"\n");
    assert!(
        e[0].contains("[limits] event-bytes-max:") && e[0].contains("lots"),
        "{e:?}"
    );
    let e = file_errors("[limits]\nevent-bytes-max = true\n");
    assert!(e[0].contains("expected a string or an integer"), "{e:?}");
    let e = file_errors("[listener]\nno-tx-timestamps = \"yes\"\n");
    assert!(e[0].contains("expected true or false"), "{e:?}");
    let e = file_errors("[listener]\nlisten = [\"a\", \"b\"]\n");
    assert!(e[0].contains("takes one value"), "{e:?}");
    let e = file_errors("[limits]\ndata-dir = \"/x\"\n");
    assert!(e[0].contains("belongs in [storage]"), "{e:?}");
    let e = file_errors("[server]\nlisten = \"x\"\n");
    assert!(e[0].contains("unknown table [server]"), "{e:?}");
    let e = file_errors("cores = 2\n");
    assert!(e[0].contains("`cores` is not a table"), "{e:?}");
    let e = file_errors("[listener\n");
    assert!(!e.is_empty());
    // Every error at once, each with the file's name.
    let e = file_errors("[limits]\na = 1\nb = 2\n");
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e.iter().all(|l| l.contains(".tmp")), "{e:?}");
}

#[test]
fn credentials_are_redacted_in_the_description() {
    let f = file(
        "[cluster]\nnats-url = [\"nats://u:secret@127.0.0.1:4222\"]\n\
         [mcp]\nupstream-cmd = \"node server.js --api-key=secret\"\n",
    );
    let l = load(args(&["--config", f.path().to_str().unwrap()])).unwrap();
    let d = describe(&l);
    assert!(!d.contains("secret"), "{d}");
    assert!(d.contains("nats://<redacted>@127.0.0.1:4222"), "{d}");
    assert!(d.contains("\"node <2 more words redacted>\""), "{d}");
}
