//! Redis as production runs it: a Cluster of three masters (`redis+cluster://`), and a
//! master with a replica watched by a Sentinel (`redis+sentinel://`) that fails over
//! while gateways run. Real `redis-server` processes, as the rest of these tests.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::upstream::start_upstream;
use super::harness::{free_port, keys_dir, script, Backend, Gateway};

/// A `redis-server` with `args` on a free port, killed when dropped.
struct Node {
    port: u16,
    child: Option<Child>,
}

impl Node {
    /// `args` first, as a config file must be.
    fn start(dir: &Path, args: &[&str]) -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(args)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &dir.display().to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server; scripts/setup test installs it)");
        let node = Self {
            port,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        node
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.kill());
            drop(child.wait());
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Cluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Three masters holding every slot.
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let nodes: Vec<Node> = (0..3)
            .map(|i| {
                let node_dir = dir.path().join(format!("node{i}"));
                std::fs::create_dir(&node_dir).expect("node dir");
                Node::start(&node_dir, &["--cluster-enabled", "yes"])
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(Node::address).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(created.success(), "the cluster was not made");
        wait_until("cluster_state:ok on every node", 20, || {
            nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        Self { nodes, _dir: dir }
    }
}

impl Backend for Cluster {
    /// Two of the three nodes: the client finds the third.
    fn url(&self) -> String {
        format!(
            "redis+cluster://{},{}",
            self.nodes[0].address(),
            self.nodes[1].address()
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_holds_a_limit_and_a_quota_across_gateways() {
    let cluster = Cluster::start();
    let upstream = start_upstream(script()).await;
    let dir = keys_dir("rpm=10 daily_tokens=100000");
    let deadline = ["--state-timeout-ms", "500"];
    let gateways = [
        Gateway::start(dir.path(), Some(&upstream.url), &cluster, &deadline).await,
        Gateway::start(dir.path(), Some(&upstream.url), &cluster, &deadline).await,
    ];
    for gateway in &gateways {
        assert!(gateway.until_state_up().await, "the cluster answers");
    }
    let mut allowed = 0;
    for n in 0..16 {
        let (status, body, _) = gateways[n % 2].chat().await;
        match status {
            200 => allowed += 1,
            429 => assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}"),
            _ => panic!("{status}: {body}"),
        }
    }
    assert!(
        (10..=11).contains(&allowed),
        "10 a minute over both gateways, not {allowed}"
    );
    // The key's buckets, quota counter and holds share one slot: one node holds them all.
    let holding: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["--scan", "--pattern", "llmgate:*{alice}*"]))
        .filter(|keys| !keys.trim().is_empty())
        .collect();
    assert_eq!(holding.len(), 1, "{holding:?}");
    let stats = gateways[1].stats().await;
    assert!(
        stats["quotas"][0]["used"].as_u64().unwrap_or(0) > 0,
        "{stats}"
    );
}

struct Sentinel {
    master: Node,
    replica: Node,
    sentinel: Node,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// A master, its replica, and one sentinel (quorum 1) that fails over a second after
    /// the master stops answering.
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let master = Node::start(dir.path(), &[]);
        let replica_dir = dir.path().join("replica");
        std::fs::create_dir(&replica_dir).expect("dir");
        let replica = Node::start(
            &replica_dir,
            &["--replicaof", "127.0.0.1", &master.port.to_string()],
        );
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "sentinel monitor llmgate 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds llmgate 1000\n\
                 sentinel failover-timeout llmgate 5000\n",
                master.port
            ),
        )
        .expect("sentinel.conf");
        let sentinel_dir = dir.path().join("sentinel");
        std::fs::create_dir(&sentinel_dir).expect("dir");
        let sentinel = Node::start(
            &sentinel_dir,
            &[config.to_str().expect("path"), "--sentinel"],
        );
        wait_until("the replica in sync", 20, || {
            master
                .cli(&["INFO", "replication"])
                .contains("connected_slaves:1")
        });
        Self {
            master,
            replica,
            sentinel,
            _dir: dir,
        }
    }
}

impl Backend for Sentinel {
    fn url(&self) -> String {
        format!("redis+sentinel://{}/llmgate", self.sentinel.address())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_moves_the_gateways_to_the_new_master() {
    let mut sentinel = Sentinel::start();
    let upstream = start_upstream(script()).await;
    let dir = keys_dir("rpm=600");
    let deadline = ["--state-timeout-ms", "500"];
    let gateway = Gateway::start(dir.path(), Some(&upstream.url), &sentinel, &deadline).await;
    assert!(gateway.until_state_up().await, "the master answers");
    let (status, body, _) = gateway.chat().await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !sentinel
            .master
            .cli(&["KEYS", "llmgate:limit:*"])
            .trim()
            .is_empty(),
        "charged on the master"
    );

    sentinel.master.kill();
    let replica = &sentinel.replica;
    wait_until("the sentinel promotes the replica", 30, || {
        replica.cli(&["ROLE"]).starts_with("master")
    });
    let until = Instant::now() + Duration::from_secs(15);
    while gateway.ready().await.1["state"]["up"] != true {
        assert!(
            Instant::now() < until,
            "the gateway follows the sentinel to the new master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Replicated from the old master: gone, so that a charge must write it anew.
    replica.cli(&["DEL", "llmgate:limit:{alice}:rpm:600"]);
    let (status, body, _) = gateway.chat().await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !replica.cli(&["KEYS", "llmgate:limit:*"]).trim().is_empty(),
        "charged on the new master"
    );
}
