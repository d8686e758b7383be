//! Goal: with token authentication on, every operation through every door
//! (native, Pulsar, HTTP) is allowed exactly when Pulsar's rules say so, a
//! refused one leaves no trace, and grants survive a restart (issue #20).
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
//!
//! The same cells go through each door that has the operation: the native
//! door (SDK) has them all; the Pulsar door (the official Python client,
//! auth method `token`) produces, consumes and asks for partitioned
//! metadata; the HTTP door (REST admin with `Authorization: Bearer`) has
//! the admin operations Pulsar's REST API has. The matrix size is printed
//! per door.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{AuthToken, Client, ClientError, ClientOptions, ErrorCode, OutgoingMessage};
use magnetar_core::auth::{create_token, SigningKey};
use magnetar_tests::http::request;
use magnetar_tests::{run_async_with_timeout, run_cli, run_pulsar_test, test_dir, BrokerOptions, BrokerProcess};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
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
    /// A `consume` grant on the namespace itself (or tenant admin): what
    /// Pulsar asks for listing a namespace's topics.
    NamespaceConsume,
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
            Op::TenantsList | Op::TenantsCreate | Op::TenantsGet | Op::BrokerShardStats => Needs::Superuser,
            Op::TopicsList => Needs::NamespaceConsume,
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
        Needs::NamespaceConsume => admin || ns_consume,
    }
}

/// The doors a cell goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Door {
    Native,
    Pulsar,
    Http,
}

const DOORS: [Door; 3] = [Door::Native, Door::Pulsar, Door::Http];

impl Door {
    /// Whether this door has `op` (the Pulsar protocol has no admin
    /// operations; Pulsar's REST API has no produce, consume or lookup, and
    /// Magnetar's has no permissions or topic policies yet).
    fn has(self, op: Op) -> bool {
        match self {
            Door::Native => true,
            Door::Pulsar => matches!(op, Op::Produce | Op::Consume | Op::PartitionedMetadata),
            Door::Http => matches!(
                op,
                Op::PartitionedMetadata
                    | Op::TopicStats
                    | Op::LastMessageId
                    | Op::TenantsList
                    | Op::TenantsCreate
                    | Op::TenantsGet
                    | Op::NamespacesList
                    | Op::NamespacesCreate
                    | Op::NamespacesPolicies
                    | Op::NamespacesSetPolicies
                    | Op::TopicsCreate
                    | Op::TopicsDelete
                    | Op::TopicsList
            ),
        }
    }
}

/// One cell of the matrix: `id` makes the names it creates unique.
#[derive(Debug, Clone, Copy)]
struct Cell {
    id: usize,
    door: Door,
    role: Role,
    op: Op,
    topic: &'static str,
}

/// Every cell, generated: doors × roles × operations × resources (the
/// operations a door has).
fn cells(resources: &[&'static str]) -> Vec<Cell> {
    let mut out = Vec::new();
    for door in DOORS {
        for role in ROLES {
            for op in OPS.into_iter().filter(|op| door.has(*op)) {
                for &topic in resources {
                    out.push(Cell { id: out.len(), door, role, op, topic });
                }
            }
        }
    }
    out
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

/// Runs one cell through the REST admin; its HTTP status.
async fn run_http(addr: SocketAddr, token: Option<&str>, op: Op, topic: &str, cell: usize) -> u16 {
    let (tenant, ns) = parts(topic);
    let local = topic.strip_prefix("persistent://").unwrap();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("Authorization", b.as_str())).collect();
    let (method, path, body) = match op {
        Op::PartitionedMetadata => ("GET", format!("/admin/v2/persistent/{local}/partitions"), None),
        Op::TopicStats => ("GET", format!("/admin/v2/persistent/{local}/stats"), None),
        Op::LastMessageId => ("GET", format!("/admin/v2/persistent/{local}/lastMessageId"), None),
        Op::TenantsList => ("GET", "/admin/v2/tenants".to_string(), None),
        Op::TenantsCreate => (
            "PUT",
            format!("/admin/v2/tenants/t-{cell}"),
            Some(r#"{"adminRoles":[],"allowedClusters":["standalone"]}"#),
        ),
        Op::TenantsGet => ("GET", format!("/admin/v2/tenants/{tenant}"), None),
        Op::NamespacesList => ("GET", format!("/admin/v2/namespaces/{tenant}"), None),
        Op::NamespacesCreate => ("PUT", format!("/admin/v2/namespaces/{tenant}/ns-{cell}"), None),
        Op::NamespacesPolicies => ("GET", format!("/admin/v2/namespaces/{ns}"), None),
        Op::NamespacesSetPolicies => ("POST", format!("/admin/v2/namespaces/{ns}/messageTTL"), Some("0")),
        Op::TopicsCreate => ("PUT", format!("/admin/v2/persistent/{ns}/new-{cell}"), None),
        Op::TopicsDelete => ("DELETE", format!("/admin/v2/persistent/{ns}/del-{cell}"), None),
        Op::TopicsList => ("GET", format!("/admin/v2/persistent/{ns}"), None),
        other => panic!("{other:?} has no REST call"),
    };
    let answer = request(addr, method, &path, body, &headers).await;
    if !(200..300).contains(&answer.status) {
        // Refusals carry Pulsar's JSON error body.
        assert!(answer.json()["reason"].is_string(), "{method} {path}: {answer:?}");
    }
    answer.status
}

/// Runs the Pulsar door's cells in one Python process; each cell's result
/// ("ok" or the client's exception class) by cell id.
fn run_pulsar_cells(url: &str, dir: &Path, cells: &[Cell]) -> HashMap<usize, String> {
    // A client whose handshake is refused retries until its operation
    // timeout (the C++ client's behaviour, against Apache Pulsar too):
    // keep that short for the roles that cannot authenticate.
    let roles: serde_json::Map<String, Value> = ROLES
        .iter()
        .map(|r| {
            (r.name().to_string(), json!({ "token": r.token(), "timeout": if r.authenticates() { 20 } else { 1 } }))
        })
        .collect();
    let op_name = |op: Op| match op {
        Op::Produce => "produce",
        Op::Consume => "consume",
        Op::PartitionedMetadata => "partitioned_metadata",
        other => panic!("{other:?} is not on the Pulsar door"),
    };
    let cells: Vec<Value> = cells
        .iter()
        .map(|c| json!({ "id": c.id, "role": c.role.name(), "op": op_name(c.op), "topic": c.topic }))
        .collect();
    let spec = dir.join("pulsar-cells.json");
    std::fs::write(&spec, json!({ "roles": roles, "cells": cells }).to_string()).unwrap();
    run_pulsar_test(
        &format!("pulsar://{url}"),
        "auth_matrix",
        "unused",
        &[spec.to_str().unwrap()],
        Duration::from_secs(240),
    );
    let results = std::fs::read_to_string(dir.join("pulsar-cells.json.results")).unwrap();
    let results: HashMap<String, String> = serde_json::from_str(&results).unwrap();
    results.into_iter().map(|(id, result)| (id.parse().unwrap(), result)).collect()
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
    run_async_with_timeout(Duration::from_secs(600), || async {
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
        let all = cells(&resources);
        println!(
            "security matrix: {} roles x {} operations x {} resources, through {} doors",
            ROLES.len(),
            OPS.len(),
            resources.len(),
            DOORS.len()
        );
        for door in DOORS {
            let n = all.iter().filter(|c| c.door == door).count();
            let ops = OPS.iter().filter(|op| door.has(**op)).count();
            println!(
                "security matrix, {door:?} door: {} roles x {ops} operations x {} resources = {n} cells",
                ROLES.len(),
                resources.len()
            );
        }
        // Topics each delete cell may delete, made by the superuser first.
        for c in all.iter().filter(|c| c.op == Op::TopicsDelete) {
            let (_, ns) = parts(c.topic);
            let t = format!("persistent://{ns}/del-{}", c.id);
            root.admin().call("topics.create", json!({ "topic": t })).await.unwrap();
        }

        let mut asserted: HashMap<Door, (usize, usize)> = HashMap::new();
        let mut count = |door: Door, want: bool| {
            let e = asserted.entry(door).or_default();
            if want {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        };

        // The native door, one SDK client per role.
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
            for c in all.iter().filter(|c| c.door == Door::Native && c.role == role) {
                let want = expected(role, c.op, c.topic);
                match &client {
                    None => assert!(!want),
                    Some(client) => {
                        let got = run_op(client, c.op, c.topic, c.id).await;
                        match (&got, want) {
                            (Ok(()), true) => {}
                            (Err(e), false) if code(e) == Some(ErrorCode::AuthorizationError) => {
                                assert_no_trace(&root, c.op, c.topic, c.id).await;
                            }
                            _ => panic!("native cell {c:?}: expected allowed={want}, got {got:?}"),
                        }
                    }
                }
                count(Door::Native, want);
            }
            if let Some(c) = client {
                c.close();
            }
        }

        // The HTTP door: a request per cell, with the role's bearer token.
        let http = broker.http_addr();
        for c in all.iter().filter(|c| c.door == Door::Http) {
            let want = expected(c.role, c.op, c.topic);
            let status = run_http(http, c.role.token().as_deref(), c.op, c.topic, c.id).await;
            let expect = if !c.role.authenticates() {
                "401"
            } else if want {
                "2xx"
            } else {
                "403"
            };
            let ok = match expect {
                "2xx" => (200..300).contains(&status),
                e => status.to_string() == e,
            };
            assert!(ok, "http cell {c:?}: expected {expect}, got {status}");
            if !want {
                assert_no_trace(&root, c.op, c.topic, c.id).await;
            }
            count(Door::Http, want);
        }

        // The Pulsar door: every cell in one Python process.
        let pulsar_cells: Vec<Cell> = all.iter().filter(|c| c.door == Door::Pulsar).copied().collect();
        let results = run_pulsar_cells(&url, dir.path(), &pulsar_cells);
        for c in &pulsar_cells {
            let want = expected(c.role, c.op, c.topic);
            let got = results.get(&c.id).unwrap_or_else(|| panic!("pulsar cell {c:?}: no result"));
            // A refused handshake: the C++ client treats it as a lost
            // connection and retries until its operation timeout.
            let expect = if !c.role.authenticates() {
                "Timeout"
            } else if want {
                "ok"
            } else {
                "AuthorizationError"
            };
            assert_eq!(got, expect, "pulsar cell {c:?}");
            if !want {
                assert_no_trace(&root, c.op, c.topic, c.id).await;
            }
            count(Door::Pulsar, want);
        }

        let mut total = 0;
        for door in DOORS {
            let (allowed, denied) = asserted.get(&door).copied().unwrap_or_default();
            assert_eq!(allowed + denied, all.iter().filter(|c| c.door == door).count(), "{door:?}");
            assert!(allowed > 0 && denied > 0, "{door:?}");
            println!("security matrix, {door:?} door: {allowed} allowed, {denied} denied, every cell asserted");
            total += allowed + denied;
        }
        assert_eq!(total, all.len());
        println!("security matrix: {total} cells asserted through {} doors", DOORS.len());

        // The refusals were logged with the peer and the reason, never the token.
        let log = broker.log();
        assert!(log.contains("authentication refused: the token has expired"), "{}", broker.log_tail());
        assert!(log.contains("http authentication refused: the token has expired"), "{}", broker.log_tail());
        assert!(log.contains("http request denied"), "{}", broker.log_tail());
        // Every HS256 token begins with the same encoded header.
        assert!(!log.contains(&Role::Expired.token().unwrap()[..20]), "a token is in the log");

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
/// (broker port or HTTP port) refuses to start and says why and how to fix
/// it.
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
    // The HTTP port too: its REST admin can change everything.
    let run = run_cli(
        [
            "standalone",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "0.0.0.0:0",
            "--data-dir",
            dir.path().join("d").to_str().unwrap(),
            "--no-pin",
        ],
        CLI_TIMEOUT,
    );
    assert!(!run.status.success(), "started unauthenticated with HTTP on 0.0.0.0");
    assert!(run.stderr.contains("(--http-listen) without authentication"), "{}", run.stderr);
    assert!(run.stderr.contains("--allow-unauthenticated"), "{}", run.stderr);
}

/// Pulsar's token refresh: when the token a Pulsar connection authenticated
/// with expires, the broker sends AUTH_CHALLENGE; the official client asks
/// its token supplier again and answers AUTH_RESPONSE, and a fresh token for
/// the same role keeps the connection; an expired answer closes it.
#[test]
fn pulsar_connections_refresh_their_token_on_auth_challenge() {
    let dir = test_dir("security-refresh");
    let key = dir.path().join("secret.key");
    std::fs::write(&key, SECRET).unwrap();
    let mut opts = BrokerOptions::new(1);
    opts.extra_args =
        vec!["--auth-token-secret-key".into(), key.to_str().unwrap().into(), "--superuser-roles".into(), "root".into()];
    let mut broker = BrokerProcess::start_with(&dir.path().join("data"), &opts);
    // Long enough for both clients to connect and produce once.
    let short_exp = now() + 6;
    let spec = json!({
        "short": create_token(&SigningKey::Secret(SECRET.to_vec()), "root", Some(short_exp)).unwrap(),
        "fresh": token("root"),
        "short_exp": short_exp,
    });
    let path = dir.path().join("refresh.json");
    std::fs::write(&path, spec.to_string()).unwrap();
    let run = run_pulsar_test(
        &format!("pulsar://{}", broker.url()),
        "auth_refresh",
        "persistent://public/default/refresh",
        &[path.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert!(run.stdout.contains("stale client"), "{}", run.stdout);
    let log = broker.log();
    assert!(log.contains("token refreshed"), "{}", broker.log_tail());
    assert!(log.contains("authentication refresh refused: the token has expired"), "{}", broker.log_tail());
    broker.assert_running();
}
