//! The broker's configuration file and environment: every flag of
//! `magnetar standalone` has a key in a section of a TOML file
//! (`--config FILE`) and an environment variable `MAGNETAR_SECTION_KEY`.
//! Precedence: file < environment < flag.
//!
//! How: the file's and the environment's settings become flags placed
//! before the command line's, and the standalone command lets a later
//! occurrence of a flag override an earlier one (`args_override_self`).
//! So clap parses and checks every value, whatever its source.
//!
//! A new flag needs one line in [`KEYS`]; the test
//! `every_standalone_flag_has_a_key` fails until it has one.

use clap::CommandFactory;
use std::ffi::OsString;

/// `(section, key, clap argument id)` of every flag of `magnetar standalone`
/// (the id is the field's name in `StandaloneArgs`; the flag is
/// `--id-with-dashes`).
pub const KEYS: &[(&str, &str, &str)] = &[
    ("broker", "listen", "listen"),
    ("broker", "shard_port_base", "shard_port_base"),
    ("broker", "no_shard_ports", "no_shard_ports"),
    ("broker", "shards", "shards"),
    ("broker", "no_pin", "no_pin"),
    ("storage", "data_dir", "data_dir"),
    ("storage", "segment_mib", "segment_mib"),
    ("storage", "segment_prezero", "segment_prezero"),
    ("storage", "segment_zero_ahead_mib", "segment_zero_ahead_mib"),
    ("storage", "lone_sync_max_us", "lone_sync_max_us"),
    ("storage", "lone_yield_max_us", "lone_yield_max_us"),
    ("storage", "segment_recycle", "segment_recycle"),
    ("storage", "write_cache_mib", "write_cache_mib"),
    ("storage", "index_cache_mib", "index_cache_mib"),
    ("storage", "allow_tmpfs", "allow_tmpfs"),
    ("storage", "accept_data_loss", "accept_data_loss"),
    ("storage", "disk_refuse_pct", "disk_refuse_pct"),
    ("storage", "ledger_max_entries", "ledger_max_entries"),
    ("storage", "ledger_max_bytes", "ledger_max_bytes"),
    ("storage", "ledger_max_age_s", "ledger_max_age_s"),
    ("storage", "ledger_min_rollover_s", "ledger_min_rollover_s"),
    ("storage", "retention_check_interval_s", "retention_check_interval_s"),
    ("storage", "topic_idle_unload_s", "topic_idle_unload_s"),
    ("limits", "unacked_per_consumer_max", "unacked_per_consumer_max"),
    ("limits", "unacked_per_subscription_max", "unacked_per_subscription_max"),
    ("limits", "delayed_index_max", "delayed_index_max"),
    ("limits", "connections_per_shard_max", "connections_per_shard_max"),
    ("limits", "connections_reserve", "connections_reserve"),
    ("limits", "connections_per_peer_max", "connections_per_peer_max"),
    ("limits", "handshake_timeout_s", "handshake_timeout_s"),
    ("limits", "idle_timeout_s", "idle_timeout_s"),
    ("limits", "partial_frame_timeout_s", "partial_frame_timeout_s"),
    ("limits", "unread_output_timeout_s", "unread_output_timeout_s"),
    ("limits", "outbox_bytes_max", "outbox_bytes_max"),
    ("limits", "shard_buffered_bytes_max", "shard_buffered_bytes_max"),
    ("pulsar", "listen", "pulsar_listen"),
    ("pulsar", "advertised_address", "advertised_address"),
    ("pulsar", "max_message_bytes", "pulsar_max_message_bytes"),
    ("pulsar", "keep_alive_interval_s", "pulsar_keep_alive_interval_s"),
    ("auth", "token_secret_key", "auth_token_secret_key"),
    ("auth", "token_public_key", "auth_token_public_key"),
    ("auth", "anonymous_role", "anonymous_role"),
    ("auth", "superuser_roles", "superuser_roles"),
    ("auth", "allow_unauthenticated", "allow_unauthenticated"),
    ("tls", "cert", "tls_cert"),
    ("tls", "key", "tls_key"),
    ("tls", "client_ca", "tls_client_ca"),
    ("tls", "handshakes_max", "tls_handshakes_max"),
    ("http", "listen", "http_listen"),
    ("http", "disabled", "no_http"),
    ("http", "metrics_namespace_level", "metrics_namespace_level"),
];

/// A bad configuration file or environment variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("configuration file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("configuration file {path}: unknown keys: {keys}")]
    UnknownKeys { path: String, keys: String },
    #[error("configuration file {path}: [{section}] {key} must be a string, a number or a boolean")]
    BadValue { path: String, section: String, key: String },
    #[error("environment variable {name}: {message}")]
    Env { name: String, message: String },
}

/// The standalone command as clap sees it.
fn standalone_command() -> clap::Command {
    let cli = crate::Cli::command();
    cli.find_subcommand("standalone").expect("the standalone subcommand").clone()
}

/// Whether the argument `id` is a boolean switch (takes no value).
fn is_switch(cmd: &clap::Command, id: &str) -> bool {
    cmd.get_arguments().find(|a| a.get_id() == id).is_some_and(|a| !a.get_action().takes_values())
}

fn flag_of(id: &str) -> String {
    format!("--{}", id.replace('_', "-"))
}

fn env_name(section: &str, key: &str) -> String {
    format!("MAGNETAR_{}_{}", section.to_uppercase(), key.to_uppercase())
}

/// The flag(s) one setting stands for: a switch is given when true.
fn setting_args(cmd: &clap::Command, id: &str, value: &str, out: &mut Vec<OsString>) -> Result<(), String> {
    if is_switch(cmd, id) {
        match value {
            "true" | "1" => out.push(flag_of(id).into()),
            "false" | "0" => {}
            other => return Err(format!("{other:?} is not true or false")),
        }
    } else {
        out.push(format!("{}={value}", flag_of(id)).into());
    }
    Ok(())
}

/// The flags a configuration file's text stands for.
pub fn file_args(path: &str, text: &str) -> Result<Vec<OsString>, ConfigError> {
    let cmd = standalone_command();
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
    let mut unknown = Vec::new();
    let mut out = Vec::new();
    for (section, body) in &table {
        let Some(body) = body.as_table() else {
            unknown.push(section.clone());
            continue;
        };
        for (key, value) in body {
            let Some((_, _, id)) = KEYS.iter().find(|(s, k, _)| s == section && k == key) else {
                unknown.push(format!("[{section}] {key}"));
                continue;
            };
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => {
                    return Err(ConfigError::BadValue { path: path.into(), section: section.clone(), key: key.clone() })
                }
            };
            setting_args(&cmd, id, &text, &mut out).map_err(|message| ConfigError::Parse {
                path: path.into(),
                message: format!("[{section}] {key}: {message}"),
            })?;
        }
    }
    if !unknown.is_empty() {
        return Err(ConfigError::UnknownKeys { path: path.into(), keys: unknown.join(", ") });
    }
    Ok(out)
}

/// The flags the `MAGNETAR_SECTION_KEY` variables of `env` stand for
/// (other variables are not settings and are left alone).
pub fn env_args(env: impl Iterator<Item = (String, String)>) -> Result<Vec<OsString>, ConfigError> {
    let cmd = standalone_command();
    let vars: std::collections::BTreeMap<String, String> = env.collect();
    let mut out = Vec::new();
    for (section, key, id) in KEYS {
        let name = env_name(section, key);
        if let Some(value) = vars.get(&name) {
            setting_args(&cmd, id, value, &mut out).map_err(|message| ConfigError::Env { name, message })?;
        }
    }
    Ok(out)
}

/// `magnetar standalone ARGS` as clap will parse it: the file's settings
/// (`--config FILE` or `--config=FILE` in `args`), then the environment's,
/// then `args` (which win).
pub fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, ConfigError> {
    let mut path = None;
    let mut iter = args.iter();
    while let Some(a) = iter.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            path = iter.next().map(|p| p.to_string_lossy().into_owned());
        } else if let Some(p) = a.strip_prefix("--config=") {
            path = Some(p.to_string());
        }
    }
    let mut out = Vec::new();
    if let Some(path) = path {
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        out.extend(file_args(&path, &text)?);
    }
    out.extend(env_args(std::env::vars())?);
    out.extend(args);
    Ok(out)
}

/// A value as TOML writes it: numbers and booleans bare, the rest quoted.
fn toml_value(raw: &str) -> String {
    if raw.parse::<i64>().is_ok() || raw == "true" || raw == "false" {
        raw.to_string()
    } else {
        toml::Value::String(raw.to_string()).to_string()
    }
}

/// `text`'s words in lines of at most `width` characters (a longer word
/// alone on its line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// A file with every key, in [`KEYS`]' order, each with its help as a
/// comment; `value(id)` gives the value to write (`None`: commented out).
fn render(cmd: &clap::Command, value: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::from(
        "# magnetar standalone configuration (--config FILE).\n\
         # Environment variables MAGNETAR_SECTION_KEY override this file;\n\
         # command-line flags override both.\n",
    );
    let mut section = "";
    for (s, key, id) in KEYS {
        if *s != section {
            out.push_str(&format!("\n[{s}]\n"));
            section = s;
        }
        let arg = cmd.get_arguments().find(|a| a.get_id() == *id).expect("every key names an argument");
        let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
        for line in wrap(&help, 76) {
            out.push_str(&format!("# {line}\n"));
        }
        out.push_str(&format!("# ({}, {})\n", flag_of(id), env_name(s, key)));
        match value(id) {
            Some(v) => out.push_str(&format!("{key} = {}\n", toml_value(&v))),
            None => out.push_str(&format!("# {key} =\n")),
        }
    }
    out
}

/// `magnetar config default`: the full default file, with comments.
pub fn default_file() -> String {
    let cmd = standalone_command();
    render(&cmd, |id| {
        if is_switch(&cmd, id) {
            return Some("false".into());
        }
        let arg = cmd.get_arguments().find(|a| a.get_id() == id)?;
        arg.get_default_values().first().map(|v| v.to_string_lossy().into_owned())
    })
}

/// `magnetar config show ARGS`: the effective configuration of
/// `magnetar standalone ARGS` (file, environment and flags applied).
pub fn effective_file(args: Vec<OsString>) -> Result<String, Box<dyn std::error::Error>> {
    let cmd = standalone_command();
    let mut argv: Vec<OsString> = vec!["standalone".into()];
    argv.extend(expand(args)?);
    let matches = cmd.clone().try_get_matches_from(argv)?;
    Ok(render(&cmd, |id| {
        if is_switch(&cmd, id) {
            return Some(matches.get_flag(id).to_string());
        }
        matches.get_raw(id).and_then(|mut v| v.next_back()).map(|v| v.to_string_lossy().into_owned())
    }))
}

/// `magnetar config`.
#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum ConfigCmd {
    /// Print the full default configuration file, with comments.
    Default,
    /// Print the effective configuration of `magnetar standalone ARGS`
    /// (its --config file, MAGNETAR_* variables and flags applied).
    Show {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

pub fn run(args: ConfigArgs) -> Result<(), Box<dyn std::error::Error>> {
    match args.command {
        ConfigCmd::Default => print!("{}", default_file()),
        ConfigCmd::Show { args } => print!("{}", effective_file(args)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Arguments of the standalone command that are not settings.
    const NOT_SETTINGS: &[&str] = &["config", "help"];

    /// Keys of [`KEYS`] that are not arguments, and arguments without a key.
    fn coverage() -> (Vec<String>, Vec<String>) {
        let cmd = standalone_command();
        let ids: BTreeSet<String> = cmd
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .filter(|id| !NOT_SETTINGS.contains(&id.as_str()))
            .collect();
        let keyed: BTreeSet<String> = KEYS.iter().map(|(_, _, id)| id.to_string()).collect();
        (keyed.difference(&ids).cloned().collect(), ids.difference(&keyed).cloned().collect())
    }

    fn parse(args: Vec<OsString>) -> crate::standalone::StandaloneArgs {
        use clap::FromArgMatches;
        let mut argv: Vec<OsString> = vec!["standalone".into()];
        argv.extend(args);
        let m = standalone_command().try_get_matches_from(argv).expect("parses");
        crate::standalone::StandaloneArgs::from_arg_matches(&m).expect("typed")
    }

    /// Goal: a flag added to `magnetar standalone` without a key (or a key
    /// left behind by a removed flag) fails here, naming it.
    #[test]
    fn every_standalone_flag_has_a_key() {
        let (stale, missing) = coverage();
        assert!(stale.is_empty(), "keys without a flag: {stale:?}");
        assert!(missing.is_empty(), "flags without a key in config::KEYS: {missing:?}");
        let mut seen = BTreeSet::new();
        for (s, k, _) in KEYS {
            assert!(seen.insert((s, k)), "[{s}] {k} twice");
        }
    }

    /// Goal: file < environment < flag, for values and switches.
    #[test]
    fn file_then_environment_then_flags() {
        let file = "[http]\nlisten = \"127.0.0.1:1111\"\n[storage]\nsegment_mib = 64\nwrite_cache_mib = 8\n\
                    [broker]\nno_pin = true\n[limits]\ndelayed_index_max = 10\n";
        let mut args = file_args("f.toml", file).expect("file");
        let env = [
            ("MAGNETAR_STORAGE_SEGMENT_MIB".to_string(), "32".to_string()),
            ("MAGNETAR_LIMITS_DELAYED_INDEX_MAX".to_string(), "20".to_string()),
            ("MAGNETAR_TEST_ECHO".to_string(), "1".to_string()),
        ];
        args.extend(env_args(env.into_iter()).expect("env"));
        args.extend(["--delayed-index-max", "30"].map(OsString::from));
        let a = parse(args);
        assert_eq!(a.http_listen.to_string(), "127.0.0.1:1111", "file");
        assert_eq!(a.write_cache_mib, 8, "file");
        assert_eq!(a.segment_mib, 32, "environment over file");
        assert_eq!(a.delayed_index_max, 30, "flag over environment and file");
        assert!(a.no_pin, "a switch from the file");
        assert_eq!(a.ledger_max_entries, 50_000, "default");
    }

    /// Goal: unknown sections and keys are an error naming each of them;
    /// a bad value is clap's error naming the flag.
    #[test]
    fn unknown_keys_are_named() {
        let e = file_args("m.toml", "[http]\nlisen = \"x\"\n[nope]\na = 1\n[broker]\nshards = 2\n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("[http] lisen") && text.contains("[nope] a"), "{text}");
        let args = file_args("m.toml", "[storage]\nsegment_mib = \"lots\"\n").expect("strings pass to clap");
        let mut argv: Vec<OsString> = vec!["standalone".into()];
        argv.extend(args);
        let err = standalone_command().try_get_matches_from(argv).unwrap_err().to_string();
        assert!(err.contains("--segment-mib"), "{err}");
        assert!(env_args([("MAGNETAR_BROKER_NO_PIN".to_string(), "yes".to_string())].into_iter()).is_err());
    }

    /// Goal: the default file has every key, parses back as a file and
    /// stands for exactly the defaults.
    #[test]
    fn the_default_file_round_trips() {
        let text = default_file();
        for (s, k, _) in KEYS {
            assert!(text.contains(&format!("[{s}]")), "{s}");
            assert!(text.contains(&format!("{k} =")), "{k}");
        }
        let args = file_args("default.toml", &text).expect("the default file is a valid file");
        let from_file = format!("{:?}", parse(args));
        let defaults = format!("{:?}", parse(Vec::new()));
        assert_eq!(from_file, defaults);
    }
}
