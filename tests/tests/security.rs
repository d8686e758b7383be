//! Goal: with token authentication on, every operation through the native
//! door is allowed exactly when Pulsar's rules say so, a refused one leaves
//! no trace, and grants survive a restart (issue #20).
//!
//! Method: one broker (`--auth-token-secret-key`, superuser `root`) for the
//! whole matrix, not one per cell. Tenants A and B with admin roles
//! `admin-a` and `admin-b`; grants made through the `magnetar admin` CLI
//! with a token file: `producer` may produce on namespace A/ns, `consumer`
//! may consume there, `both-one` may do both on topic A/ns/granted only.
//! The matrix is generated: every role (those plus the superuser, an
//! anonymous client, an expired token and a token signed by another key) ×
//! every operation × every resource (a topic of the role's own tenant
//! without a topic-level grant, the granted topic, a topic of the other
//! tenant); each cell's expectation comes from this file's own oracle (the
//! rules written out again, not the broker's code) and each cell is
//! asserted. A refused mutation is checked, by the superuser, to have
//! changed nothing.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{AuthToken, Client, ClientError, ClientOptions, ErrorCode, OutgoingMessage};
use magnetar_core::auth::{create_token, SigningKey};
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerOptions, BrokerProcess};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const OTHER_SECRET: &[u8] = b"another key, not the broker's one";
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

const TOPIC_PLAIN: &str = "persistent://A/ns/plain";
const TOPIC_GRANTED: &str = "persistent://A/ns/granted";
const TOPIC_OTHER: &str = "persistent://B/ns/t";

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn token(role: &str) -> String {
    create_token(&SigningKey::Secret(SECRET.to_vec()), role, Some(now() + 3600)).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Superuser,
    AdminA,
    AdminB,
    ProducerNs,
    ConsumerNs,
    BothOneTopic,
    Anonymous,
    Expired,
    ForeignKey,
}

const ROLES: [Role; 9] = [
    Role::Superuser,
    Role::AdminA,
    Role::AdminB,
    Role::ProducerNs,
    Role::ConsumerNs,
    Role::BothOneTopic,
    Role::Anonymous,
    Role::Expired,
    Role::ForeignKey,
];

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Superuser => "root",
            Role::AdminA => "admin-a",
            Role::AdminB => "admin-b",
            Role::ProducerNs => "producer",
            Role::ConsumerNs => "consumer",
            Role::BothOneTopic => "both-one",
            Role::Anonymous => "anonymous",
            Role::Expired => "expired",
            Role::ForeignKey => "foreign-key",
        }
    }

    fn token(self) -> Option<String> {
        match self {
            Role::Anonymous => None,
            Role::Expired => {
                Some(create_token(&SigningKey::Secret(SECRET.to_vec()), "producer", Some(now() - 60)).unwrap())
            }
            Role::ForeignKey => Some(create_token(&SigningKey::Secret(OTHER_SECRET.to_vec()), "root", None).unwrap()),
            r => Some(token(r.name())),
        }
    }

    /// Whether the handshake accepts it at all.
    fn authenticates(self) -> bool {
        !matches!(self, Role::Anonymous | Role::Expired | Role::ForeignKey)
    }
}

/// What an operation needs, in Pulsar's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Superuser,
    TenantAdmin,
    Produce,
    Consume,
    Either,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Produce,
    Consume,
    Lookup,
    PartitionedMetadata,
    Owner,
    TopicStats,
    LastMessageId,
    TenantsList,
    TenantsCreate,
    TenantsGet,
    BrokerShardStats,
    NamespacesList,
    NamespacesCreate,
    NamespacesPolicies,
    NamespacesSetPolicies,
    NamespacesGrant,
    NamespacesPermissions,
    TopicsCreate,
    TopicsDelete,
    TopicsList,
    TopicsSetMessageTtl,
    TopicsGrant,
    TopicsPermissions,
    MessagesFind,
}

const OPS: [Op; 24] = [
    Op::Produce,
    Op::Consume,
    Op::Lookup,
    Op::PartitionedMetadata,
    Op::Owner,
    Op::TopicStats,
    Op::LastMessageId,
    Op::TenantsList,
    Op::TenantsCreate,
    Op::TenantsGet,
    Op::BrokerShardStats,
    Op::NamespacesList,
    Op::NamespacesCreate,
    Op::NamespacesPolicies,
    Op::NamespacesSetPolicies,
    Op::NamespacesGrant,
    Op::NamespacesPermissions,
    Op::TopicsCreate,
    Op::TopicsDelete,
    Op::TopicsList,
    Op::TopicsSetMessageTtl,
    Op::TopicsGrant,
    Op::TopicsPermissions,
    Op::MessagesFind,
];

impl Op {
    fn needs(self) -> Needs {
        match self {
            Op::Produce => Needs::Produce,
            Op::Consume | Op::LastMessageId => Needs::Consume,
            Op::Lookup | Op::PartitionedMetadata | Op::Owner | Op::TopicStats => Needs::Either,
            Op::TenantsList | Op::TenantsCreate | Op::BrokerShardStats => Needs::Superuser,
            _ => Needs::TenantAdmin,
        }
    }
}

/// The oracle: may `role` do `op` on `topic`?
fn expected(role: Role, op: Op, topic: &str) -> bool {
    if !role.authenticates() {
        return false;
    }
    if role == Role::Superuser {
        return true;
    }
    let tenant_a = topic.starts_with("persistent://A/");
    let admin = (role == Role::AdminA && tenant_a) || (role == Role::AdminB && !tenant_a);
    let ns_produce = role == Role::ProducerNs && tenant_a;
    let ns_consume = role == Role::ConsumerNs && tenant_a;
    let topic_both = role == Role::BothOneTopic && topic == TOPIC_GRANTED;
    match op.needs() {
        Needs::Superuser => false,
        Needs::TenantAdmin => admin,
        Needs::Produce => admin || ns_produce || topic_both,
        Needs::Consume => admin || ns_consume || topic_both,
        Needs::Either => admin || ns_produce || ns_consume || topic_both,
    }
}

fn options(token: Option<String>) -> ClientOptions {
    ClientOptions { auth_token: token.map(AuthToken), shard_aware: false, ..ClientOptions::default() }
}

fn code(e: &ClientError) -> Option<ErrorCode> {
    match e {
        ClientError::Broker { code, .. } => Some(*code),
        _ => None,
    }
}

fn parts(topic: &str) -> (&str, String) {
    let rest = topic.strip_prefix("persistent://").unwrap();
    let tenant = rest.split('/').next().unwrap();
    let ns = rest.rsplit_once('/').unwrap().0.to_string();
    (tenant, ns)
}

/// Runs one cell; `Ok` when the broker allowed it. `cell` makes names unique.
async fn run_op(client: &Client, op: Op, topic: &str, cell: usize) -> Result<(), ClientError> {
    let (tenant, ns) = parts(topic);
    let admin = client.admin();
    let call = |op: &'static str, args: Value| {
        let admin = admin.clone();
        async move { admin.call(op, args).await.map(|_| ()) }
    };
    match op {
        Op::Produce => {
            let p = client.producer(topic).create().await?;
            p.send(OutgoingMessage::new(format!("cell {cell}"))).await?;
            p.close().await
        }
        Op::Consume => {
            let c = client.subscribe(topic, format!("sub-{cell}")).subscribe().await?;
            c.close().await
        }
        Op::Lookup => call("topics.lookup", json!({ "topic": topic })).await,
        Op::PartitionedMetadata => call("topics.partitioned-metadata", json!({ "topic": topic })).await,
        Op::Owner => call("topics.owner", json!({ "topic": topic })).await,
        Op::TopicStats => client.topic_stats(topic).await.map(|_| ()),
        Op::LastMessageId => call("topics.last-message-id", json!({ "topic": topic })).await,
        Op::TenantsList => call("tenants.list", json!({})).await,
        Op::TenantsCreate => call("tenants.create", json!({ "tenant": format!("t-{cell}") })).await,
        Op::TenantsGet => call("tenants.get", json!({ "tenant": tenant })).await,
        Op::BrokerShardStats => call("broker.shard-stats", json!({})).await,
        Op::NamespacesList => call("namespaces.list", json!({ "tenant": tenant })).await,
        Op::NamespacesCreate => call("namespaces.create", json!({ "namespace": format!("{tenant}/ns-{cell}") })).await,
        Op::NamespacesPolicies => call("namespaces.policies", json!({ "namespace": ns })).await,
        Op::NamespacesSetPolicies => {
            call("namespaces.set-policies", json!({ "namespace": ns, "policies": { "message_ttl_seconds": 0 } })).await
        }
        Op::NamespacesGrant => {
            let args = json!({ "namespace": ns, "role": format!("r-{cell}"), "actions": ["consume"] });
            call("namespaces.grant-permission", args).await
        }
        Op::NamespacesPermissions => call("namespaces.permissions", json!({ "namespace": ns })).await,
        Op::TopicsCreate => call("topics.create", json!({ "topic": format!("persistent://{ns}/new-{cell}") })).await,
        Op::TopicsDelete => call("topics.delete", json!({ "topic": format!("persistent://{ns}/del-{cell}") })).await,
        Op::TopicsList => call("topics.list", json!({ "namespace": ns })).await,
        Op::TopicsSetMessageTtl => {
            call("topics.set-message-ttl", json!({ "topic": topic, "message_ttl_seconds": 0 })).await
        }
        Op::TopicsGrant => {
            let args = json!({ "topic": topic, "role": format!("r-{cell}"), "actions": ["produce"] });
            call("topics.grant-permission", args).await
        }
        Op::TopicsPermissions => call("topics.permissions", json!({ "topic": topic })).await,
        Op::MessagesFind => call("messages.find", json!({ "topic": topic, "key": "k" })).await,
    }
}

/// After a refused cell: the superuser sees nothing it would have made or
/// changed.
async fn assert_no_trace(root: &Client, op: Op, topic: &str, cell: usize) {
    let (tenant, ns) = parts(topic);
    let admin = root.admin();
    let names =
        |v: Value| -> Vec<String> { v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect() };
    match op {
        Op::TenantsCreate => {
            let tenants = names(admin.call("tenants.list", json!({})).await.unwrap());
            assert!(!tenants.contains(&format!("t-{cell}")), "cell {cell}: refused tenant exists");
        }
        Op::NamespacesCreate => {
            let nss = names(admin.call("namespaces.list", json!({ "tenant": tenant })).await.unwrap());
            assert!(!nss.contains(&format!("{tenant}/ns-{cell}")), "cell {cell}: refused namespace exists");
        }
        Op::TopicsCreate | Op::TopicsDelete => {
            let topics = names(admin.call("topics.list", json!({ "namespace": ns })).await.unwrap());
            if op == Op::TopicsCreate {
                assert!(!topics.contains(&format!("persistent://{ns}/new-{cell}")), "cell {cell}: refused topic made");
            } else {
                assert!(topics.contains(&format!("persistent://{ns}/del-{cell}")), "cell {cell}: refused delete ran");
            }
        }
        Op::NamespacesGrant | Op::TopicsGrant => {
            let (op_name, args) = if op == Op::NamespacesGrant {
                ("namespaces.permissions", json!({ "namespace": ns }))
            } else {
                ("topics.permissions", json!({ "topic": topic }))
            };
            let grants = admin.call(op_name, args).await.unwrap();
            assert!(grants.get(format!("r-{cell}")).is_none(), "cell {cell}: refused grant is there: {grants}");
        }
        Op::Consume => {
            let stats: Value = serde_json::from_str(&root.topic_stats(topic).await.unwrap()).unwrap();
            assert!(stats["subscriptions"].get(format!("sub-{cell}")).is_none(), "cell {cell}: refused sub exists");
        }
        _ => {}
    }
}

fn cli_admin(url: &str, token_file: &Path, args: &[&str]) {
    let mut a = vec!["admin", "--url", url, "--token-file", token_file.to_str().unwrap()];
    a.extend_from_slice(args);
    run_cli(a, CLI_TIMEOUT).assert_success();
}

#[test]
fn every_role_operation_and_resource_is_allowed_exactly_by_the_rules() {
    run_async_with_timeout(Duration::from_secs(300), || async {
        let dir = test_dir("security-matrix");
        let key = dir.path().join("secret.key");
        std::fs::write(&key, SECRET).unwrap();
        let root_token = dir.path().join("root.token");
        std::fs::write(&root_token, token("root")).unwrap();
        let mut opts = BrokerOptions::new(1);
        opts.extra_args = vec![
            "--auth-token-secret-key".into(),
            key.to_str().unwrap().into(),
            "--superuser-roles".into(),
            "root".into(),
        ];
        let data = dir.path().join("data");
        let mut broker = BrokerProcess::start_with(&data, &opts);
        let url = broker.url();

        // Setup through the CLI, as an operator would.
        let t = root_token.as_path();
        cli_admin(&url, t, &["tenants", "create", "A", "--admin-roles", "admin-a"]);
        cli_admin(&url, t, &["tenants", "create", "B", "--admin-roles", "admin-b"]);
        cli_admin(&url, t, &["namespaces", "create", "A/ns"]);
        cli_admin(&url, t, &["namespaces", "create", "B/ns"]);
        cli_admin(&url, t, &["namespaces", "grant-permission", "A/ns", "--role", "producer", "--actions", "produce"]);
        cli_admin(&url, t, &["namespaces", "grant-permission", "A/ns", "--role", "consumer", "--actions", "consume"]);
        cli_admin(
            &url,
            t,
            &["topics", "grant-permission", TOPIC_GRANTED, "--role", "both-one", "--actions", "produce,consume"],
        );
        let perms = run_cli(
            ["admin", "--url", url.as_str(), "--token-file", t.to_str().unwrap(), "namespaces", "permissions", "A/ns"],
            CLI_TIMEOUT,
        );
        perms.assert_success();
        assert_eq!(perms.stdout_lines, vec![r#"{"consumer":["consume"],"producer":["produce"]}"#.to_string()]);

        let root = Client::connect_with(&url, options(Some(token("root")))).await.unwrap();
        let resources = [TOPIC_PLAIN, TOPIC_GRANTED, TOPIC_OTHER];
        for topic in resources {
            root.admin().call("topics.create", json!({ "topic": topic })).await.unwrap();
        }
        let cells = ROLES.len() * OPS.len() * resources.len();
        println!(
            "security matrix: {} roles x {} operations x {} resources = {cells} cells",
            ROLES.len(),
            OPS.len(),
            resources.len()
        );
        // Topics each delete cell may delete, made by the superuser first.
        for cell in 0..cells {
            if OPS[(cell / resources.len()) % OPS.len()] == Op::TopicsDelete {
                let (_, ns) = parts(resources[cell % resources.len()]);
                let t = format!("persistent://{ns}/del-{cell}");
                root.admin().call("topics.create", json!({ "topic": t })).await.unwrap();
            }
        }

        let (mut allowed, mut denied) = (0, 0);
        let mut cell = 0;
        for role in ROLES {
            let client = Client::connect_with(&url, options(role.token())).await;
            let client = match client {
                Ok(c) => {
                    assert!(role.authenticates(), "{role:?} was let in");
                    Some(c)
                }
                Err(e) => {
                    assert!(!role.authenticates(), "{role:?} refused: {e}");
                    assert_eq!(code(&e), Some(ErrorCode::AuthenticationError), "{role:?}: {e}");
                    None
                }
            };
            for op in OPS {
                for topic in resources {
                    let want = expected(role, op, topic);
                    match &client {
                        None => assert!(!want),
                        Some(client) => {
                            let got = run_op(client, op, topic, cell).await;
                            match (&got, want) {
                                (Ok(()), true) => {}
                                (Err(e), false) if code(e) == Some(ErrorCode::AuthorizationError) => {
                                    assert_no_trace(&root, op, topic, cell).await;
                                }
                                _ => {
                                    panic!("cell {cell}: {role:?} {op:?} {topic}: expected allowed={want}, got {got:?}")
                                }
                            }
                        }
                    }
                    if want {
                        allowed += 1;
                    } else {
                        denied += 1;
                    }
                    cell += 1;
                }
            }
            if let Some(c) = client {
                c.close();
            }
        }
        assert_eq!(cell, cells);
        println!("security matrix: {allowed} allowed, {denied} denied, every cell asserted");
        assert!(allowed > 0 && denied > 0);

        // The refusals were logged with the peer and the reason, never the token.
        let log = broker.log();
        assert!(log.contains("authentication refused: the token has expired"), "{}", broker.log_tail());
        assert!(!log.contains(&Role::Expired.token().unwrap()[..20]));

        // Grants survive a restart.
        root.close();
        broker.terminate();
        let broker = broker.restart();
        let url = broker.url();
        let producer = Client::connect_with(&url, options(Some(token("producer")))).await.unwrap();
        let p = producer.producer(TOPIC_PLAIN).create().await.unwrap();
        p.send(OutgoingMessage::new("after restart")).await.unwrap();
        let e = producer.producer(TOPIC_OTHER).create().await.unwrap_err();
        assert_eq!(code(&e), Some(ErrorCode::AuthorizationError), "{e}");
        producer.close();
    });
}

/// A broker that would listen on every interface without authentication
/// refuses to start and says how to fix it; with `--allow-unauthenticated`
/// it starts.
#[test]
fn refuses_to_listen_unauthenticated_on_a_non_loopback_address() {
    let dir = test_dir("security-exposed");
    let run = run_cli(
        ["standalone", "--listen", "0.0.0.0:0", "--data-dir", dir.path().join("d").to_str().unwrap(), "--no-pin"],
        CLI_TIMEOUT,
    );
    assert!(!run.status.success(), "started unauthenticated on 0.0.0.0");
    assert!(run.stderr.contains("--allow-unauthenticated"), "{}", run.stderr);
    assert!(run.stderr.contains("--auth-token-secret-key"), "{}", run.stderr);
}
