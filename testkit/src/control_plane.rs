//! A throwaway control plane for cluster tests: etcd and a real kube-apiserver on free loopback
//! ports, with throwaway PKI, data and audit log, started when `KUBECONFIG` is not set and
//! `KUBE_APISERVER` names a kube-apiserver binary.
//!
//! Every child is spawned from one thread that lives as long as the test process, with
//! `PR_SET_PDEATHSIG`: the kernel kills etcd and kube-apiserver when the test process ends,
//! however it ends (all tests done, a panic, SIGKILL), because the Rust test harness never drops
//! statics. Directories left behind by dead test processes are swept at the next start.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, OnceLock, mpsc},
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// The variable naming the kube-apiserver binary the tests may start.
pub const APISERVER_VAR: &str = "KUBE_APISERVER";
/// The variable naming etcd (default `/usr/bin/etcd`).
pub const ETCD_VAR: &str = "KUBE_ETCD";

/// Services are dual-stack, IPv4 first, like most dual-stack clusters.
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:10:96::/112";

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes are audited at Metadata level (reads are not, to keep the log small), so a test can
/// prove a request was or was not made, and by whom.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  verbs: [get, list, watch]
- level: Metadata
";

/// The ways a fault test takes the apiserver away from the binary under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// SIGKILL the apiserver, start it again on the same etcd data.
    Restart,
    /// The same, with etcd compacted at its current revision while the apiserver is down.
    RestartAfterCompaction,
    /// The binary is frozen (SIGSTOP) through a restart after compaction: when it resumes, the
    /// apiserver already answers, so its watches resume from a compacted resourceVersion and
    /// get a real 410 Gone.
    FrozenThroughCompaction,
}

pub struct ControlPlane {
    dir: PathBuf,
    etcd_bin: PathBuf,
    apiserver_bin: PathBuf,
    etcd_port: u16,
    peer_port: u16,
    apiserver_port: u16,
    etcd: Mutex<Option<Child>>,
    apiserver: Mutex<Option<Child>>,
    /// Extra kube-apiserver flags from the next (re)start on, for tests of its limits.
    apiserver_args: Mutex<Vec<String>>,
    /// Extra etcd flags (a bench's `--quota-backend-bytes`), fixed at start.
    etcd_args: Vec<String>,
    /// How long a (re)started kube-apiserver may take to answer `/readyz`.
    ready_timeout: Mutex<Duration>,
    /// An admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// One JSON audit event per line, for every write.
    pub audit_log: PathBuf,
}

impl ControlPlane {
    /// The binaries named by the environment, if the tests may start a control plane.
    pub fn configured() -> Option<(PathBuf, PathBuf)> {
        let apiserver = std::env::var_os(APISERVER_VAR).filter(|v| !v.is_empty())?;
        let etcd = std::env::var_os(ETCD_VAR)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "/usr/bin/etcd".into());
        Some((
            from_repo_root(apiserver.into()),
            from_repo_root(etcd.into()),
        ))
    }

    /// Starts etcd and kube-apiserver and waits until `/readyz` answers 200. Blocking.
    pub fn start(apiserver_bin: &Path, etcd_bin: &Path) -> anyhow::Result<Self> {
        Self::start_with(apiserver_bin, etcd_bin, &[])
    }

    /// [`ControlPlane::start`] with extra etcd flags: a bench at Kubernetes' documented limits
    /// needs `--quota-backend-bytes` above etcd 3.4's 2 GiB default.
    pub fn start_with(
        apiserver_bin: &Path,
        etcd_bin: &Path,
        etcd_args: &[&str],
    ) -> anyhow::Result<Self> {
        for bin in [apiserver_bin, etcd_bin] {
            anyhow::ensure!(
                bin.is_file(),
                "{} is not a file (set {APISERVER_VAR} and {ETCD_VAR}, or KUBECONFIG)",
                bin.display()
            );
        }
        let root = base_dir();
        sweep_dead(&root);
        let dir = root.join(format!(
            "{}-{}",
            std::process::id(),
            crate::unique_name("cp")
        ));
        std::fs::create_dir_all(dir.join("pki"))?;
        pki(&dir.join("pki")).context("generating the test PKI with openssl")?;
        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
        let [etcd_port, peer_port, apiserver_port] = free_ports();
        let kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, admin_kubeconfig(&dir, apiserver_port))?;
        let cp = Self {
            audit_log: dir.join("audit.log"),
            dir,
            etcd_bin: etcd_bin.into(),
            apiserver_bin: apiserver_bin.into(),
            etcd_port,
            peer_port,
            apiserver_port,
            etcd: Mutex::new(None),
            apiserver: Mutex::new(None),
            apiserver_args: Mutex::new(Vec::new()),
            etcd_args: etcd_args.iter().map(|a| a.to_string()).collect(),
            ready_timeout: Mutex::new(READY_TIMEOUT),
            kubeconfig,
        };
        cp.start_etcd()?;
        cp.start_apiserver()?;
        Ok(cp)
    }

    /// Where the apiserver serves, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts etcd on its data directory (kept across stops) and waits until it serves.
    pub fn start_etcd(&self) -> anyhow::Result<()> {
        let mut slot = self.etcd.lock().unwrap();
        anyhow::ensure!(slot.is_none(), "etcd is already running");
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&self.etcd_bin);
        cmd.args(["--name", "default", "--data-dir"])
            .arg(self.etcd_data_dir())
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(["--log-level", "warn"])
            .args(&self.etcd_args);
        *slot = Some(spawn_logged(cmd, &self.dir.join("etcd.log"))?);
        drop(slot);
        wait_tcp(self.etcd_port, READY_TIMEOUT).context("etcd did not listen")
    }

    /// Starts kube-apiserver (same port, same etcd) and waits until `/readyz` answers 200.
    pub fn start_apiserver(&self) -> anyhow::Result<()> {
        let mut slot = self.apiserver.lock().unwrap();
        anyhow::ensure!(slot.is_none(), "kube-apiserver is already running");
        let pki = self.dir.join("pki");
        let p = |f: &str| pki.join(f).display().to_string();
        let mut cmd = Command::new(&self.apiserver_bin);
        cmd.arg(format!(
            "--etcd-servers=http://127.0.0.1:{}",
            self.etcd_port
        ))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={}", self.apiserver_port))
        // No loopback address may stand in the `kubernetes` Service's endpoints.
        .arg("--endpoint-reconciler-type=none")
        .arg(format!("--tls-cert-file={}", p("server.crt")))
        .arg(format!("--tls-private-key-file={}", p("server.key")))
        .arg(format!("--client-ca-file={}", p("ca.crt")))
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg(format!("--service-account-key-file={}", p("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            p("sa.key")
        ))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDRS}"))
        .args(["--authorization-mode=Node,RBAC", "--allow-privileged=true"])
        .arg(format!(
            "--audit-policy-file={}",
            self.dir.join("audit-policy.yaml").display()
        ))
        .arg(format!("--audit-log-path={}", self.audit_log.display()))
        .args(["--audit-log-format=json", "--audit-log-maxsize=0"])
        .args(["--profiling=false", "-v=1"])
        .args(self.apiserver_args.lock().unwrap().iter());
        *slot = Some(spawn_logged(cmd, &self.dir.join("kube-apiserver.log"))?);
        drop(slot);
        self.wait_ready()
    }

    /// Flags added to kube-apiserver's from its next start (see `restart_apiserver`) on.
    pub fn set_apiserver_args(&self, args: &[&str]) {
        *self.apiserver_args.lock().unwrap() = args.iter().map(|a| a.to_string()).collect();
    }

    /// How long kube-apiserver may take to be ready from its next (re)start on (60 s by
    /// default): a restart on a bench's 150k pods reads them all back from etcd first.
    pub fn set_ready_timeout(&self, timeout: Duration) {
        *self.ready_timeout.lock().unwrap() = timeout;
    }

    /// Kills kube-apiserver (SIGKILL, as a crash would); etcd and its data stay.
    pub fn stop_apiserver(&self) {
        kill(&mut self.apiserver.lock().unwrap());
    }

    /// Kills etcd (SIGKILL); its data directory stays for the next `start_etcd`.
    pub fn stop_etcd(&self) {
        kill(&mut self.etcd.lock().unwrap());
    }

    /// Kills kube-apiserver and starts it again on the same port and etcd data.
    pub fn restart_apiserver(&self) -> anyhow::Result<()> {
        self.stop_apiserver();
        self.start_apiserver()
    }

    /// Where etcd serves clients, `http://127.0.0.1:<port>`.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// Compacts etcd past its current revision (through etcd's v3 HTTP gateway, so no etcdctl is
    /// needed) and returns the revision compacted at: every resourceVersion before it, the
    /// newest included, is then gone (410).
    /// Blocking.
    pub fn compact_etcd(&self) -> anyhow::Result<i64> {
        // Two writes of a key outside the apiserver's prefix first, compacted at the second's
        // revision: a watch resumes after its resourceVersion, so one whose last event was the
        // newest write before would resume at the first, and must find it gone as every other.
        // "/testkit/compaction" and "x", base64.
        let mut put = String::new();
        for _ in 0..2 {
            put = etcd_post(
                self.etcd_port,
                "/v3/kv/put",
                r#"{"key":"L3Rlc3RraXQvY29tcGFjdGlvbg==","value":"eA=="}"#,
            )?;
        }
        let v: serde_json::Value = serde_json::from_str(&put)?;
        let rev: i64 = v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no revision in etcd's answer: {put}"))?;
        etcd_post(
            self.etcd_port,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{rev}","physical":true}}"#),
        )?;
        Ok(rev)
    }

    /// Defragments etcd's database (after a compaction, so the freed pages go back and the
    /// next rows of a bench start from a small file) and returns its size after, in bytes.
    /// Blocking.
    pub fn defragment_etcd(&self) -> anyhow::Result<u64> {
        etcd_post(self.etcd_port, "/v3/maintenance/defragment", "{}")?;
        let status = etcd_post(self.etcd_port, "/v3/maintenance/status", "{}")?;
        let v: serde_json::Value = serde_json::from_str(&status)?;
        v["dbSize"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no dbSize in etcd's status: {status}"))
    }

    /// Writes `item(0)`..`item(n-1)`, each a `(key, value)`, straight into etcd, `TXN_OPS` to a
    /// transaction, `threads` at a time: how a bench seeds 150k objects in seconds where the
    /// apiserver takes many minutes on 2 shared cores. The values must be objects as the
    /// apiserver stores them (it decodes JSON from etcd as well as protobuf): copy one it
    /// created, change names and UIDs, drop `resourceVersion` (etcd's revision is it).
    /// Blocking.
    pub fn etcd_put_all(
        &self,
        n: usize,
        threads: usize,
        item: impl Fn(usize) -> (String, Vec<u8>) + Sync,
    ) -> anyhow::Result<()> {
        // etcd 3.4's default --max-txn-ops.
        self.etcd_put_in_txns(n, threads, 128, item)
    }

    /// [`ControlPlane::etcd_put_all`] with `txn_ops` puts to a transaction. The objects of one
    /// transaction share one revision (their resourceVersion); an informer whose watch restarts
    /// after seeing one of them resumes *after* that revision and never sees the others. One
    /// put a transaction (`txn_ops` 1) for objects an informer of the apiserver's own (its IP
    /// repair loop) watches while they are written.
    pub fn etcd_put_in_txns(
        &self,
        n: usize,
        threads: usize,
        txn_ops: usize,
        item: impl Fn(usize) -> (String, Vec<u8>) + Sync,
    ) -> anyhow::Result<()> {
        let txn_ops = txn_ops.max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let worker = || -> anyhow::Result<()> {
            loop {
                let from = next.fetch_add(txn_ops, std::sync::atomic::Ordering::Relaxed);
                if from >= n {
                    return Ok(());
                }
                let ops: Vec<String> = (from..(from + txn_ops).min(n))
                    .map(|i| {
                        let (k, v) = item(i);
                        format!(
                            r#"{{"requestPut":{{"key":"{}","value":"{}"}}}}"#,
                            base64(k.as_bytes()),
                            base64(&v)
                        )
                    })
                    .collect();
                let body = format!(r#"{{"success":[{}]}}"#, ops.join(","));
                etcd_post(self.etcd_port, "/v3/kv/txn", &body)?;
            }
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads.max(1)).map(|_| scope.spawn(worker)).collect();
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .map_err(|_| anyhow::anyhow!("etcd writer panicked"))?
            })
        })
    }

    /// Whether etcd holds `key` (a seeding bench checks its key prefix on an object the
    /// apiserver wrote). Blocking.
    pub fn etcd_has(&self, key: &str) -> anyhow::Result<bool> {
        let body = format!(
            r#"{{"key":"{}","count_only":true}}"#,
            base64(key.as_bytes())
        );
        let answer = etcd_post(self.etcd_port, "/v3/kv/range", &body)?;
        let v: serde_json::Value = serde_json::from_str(&answer)?;
        // The gateway writes int64s as strings and leaves out zero values.
        Ok(v["count"].as_str().is_some_and(|c| c != "0"))
    }

    /// The pids of etcd and kube-apiserver, for a bench that reports their memory.
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        let pid = |m: &Mutex<Option<Child>>| m.lock().unwrap().as_ref().map(Child::id);
        (pid(&self.etcd), pid(&self.apiserver))
    }

    fn etcd_data_dir(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig.clone();
        let log = self.dir.join("kube-apiserver.log");
        let timeout = *self.ready_timeout.lock().unwrap();
        // Our caller may be inside a tokio runtime, where a nested runtime may not block.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let client = crate::client_for(&kubeconfig).await?;
                let start = Instant::now();
                loop {
                    let req = http::Request::get("/readyz").body(Vec::new())?;
                    if client.request_text(req).await.is_ok_and(|t| t == "ok") {
                        return Ok(());
                    }
                    if start.elapsed() > timeout {
                        anyhow::bail!(
                            "kube-apiserver not ready after {timeout:?}; log {}",
                            log.display()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("readiness thread panicked"))?
    }
}

/// The two halves of an [`Outage`] every recovery test goes through the same way.
impl ControlPlane {
    /// [`Outage::FrozenThroughCompaction`]: `bin` is frozen through an apiserver restart after
    /// an etcd compaction, and resumed once the apiserver answers. Returns when it was resumed:
    /// the moment recovery is measured from.
    pub async fn restart_while_frozen(
        &self,
        bin: &crate::Binary,
        outage: Outage,
    ) -> anyhow::Result<Instant> {
        bin.signal("STOP").await?;
        self.stop_apiserver();
        let rev = self.compact_etcd()?;
        println!("{outage:?}: etcd compacted at revision {rev}");
        self.start_apiserver()?;
        bin.signal("CONT").await?;
        Ok(Instant::now())
    }

    /// With the apiserver stopped at `down`: compacts etcd when `outage` is
    /// [`Outage::RestartAfterCompaction`], then rides the outage out for `length` on the child's
    /// `admin` server ([`crate::ride_out_outage`]) and asserts `/readyz` went 503 meanwhile.
    pub async fn ride_out(
        &self,
        outage: Outage,
        admin: std::net::SocketAddr,
        down: Instant,
        length: Duration,
    ) -> anyhow::Result<()> {
        if matches!(outage, Outage::RestartAfterCompaction) {
            let rev = self.compact_etcd()?;
            println!("{outage:?}: etcd compacted at revision {rev}");
        }
        let saw_503 = crate::ride_out_outage(admin, down, length).await.is_some();
        assert!(
            saw_503,
            "{outage:?}: /readyz stayed 200 through an {length:?} outage"
        );
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_apiserver();
        self.stop_etcd();
        if std::env::var_os("GK_KEEP_CONTROL_PLANE").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The control plane every cluster test of this test binary shares, started on first use.
/// One per test binary (cargo runs test binaries one after another, so sharing across them
/// would save only the start, a few seconds each): a binary's cluster-wide tests (PodGC) never see
/// another binary's objects, and a crashed binary takes only its own control plane down.
pub fn shared() -> anyhow::Result<&'static ControlPlane> {
    let (apiserver, etcd) =
        ControlPlane::configured().ok_or_else(|| anyhow::anyhow!("{APISERVER_VAR} not set"))?;
    SHARED
        .get_or_init(|| {
            let cp = ControlPlane::start(&apiserver, &etcd).map_err(|e| format!("{e:#}"))?;
            println!(
                "control plane: {} (kubeconfig {}, audit log {})",
                cp.url(),
                cp.kubeconfig.display(),
                cp.audit_log.display()
            );
            Ok(cp)
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("starting the test control plane: {e}"))
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The shared control plane, if a test of this binary has started it.
pub fn started() -> Option<&'static ControlPlane> {
    SHARED.get()?.as_ref().ok()
}

fn base_dir() -> PathBuf {
    // tmpfs when there is one: etcd fsyncs every write, and the tests write a lot.
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join("groundskeeper-control-planes")
}

/// Removes the directories of test processes that no longer run.
fn sweep_dead(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn free_ports() -> [u16; 3] {
    // Held together so the three are distinct; released just before the children bind them.
    let ls: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let port = |i: usize| ls[i].local_addr().expect("local addr").port();
    [port(0), port(1), port(2)]
}

fn wait_tcp(port: u16, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            start.elapsed() < timeout,
            "nothing on port {port} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn kill(slot: &mut Option<Child>) {
    if let Some(mut child) = slot.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running openssl (install it: apt-get install openssl)")?;
    anyhow::ensure!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A CA, the apiserver's serving certificate for 127.0.0.1, an admin client certificate in
/// `system:masters`, and the service-account signing key pair.
fn pki(dir: &Path) -> anyhow::Result<()> {
    let days = ["-days", "7"];
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=groundskeeper-test-ca",
            days[0],
            days[1],
        ],
    )?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )?;
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
    for (name, subject, ext) in [
        ("server", "/CN=kube-apiserver", "server.ext"),
        (
            "admin",
            "/O=system:masters/CN=groundskeeper-test-admin",
            "client.ext",
        ),
    ] {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subject,
            ],
        )?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-extfile",
                ext,
                days[0],
                days[1],
            ],
        )?;
    }
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])
}

fn admin_kubeconfig(dir: &Path, port: u16) -> String {
    let pki = dir.join("pki");
    let p = |f: &str| pki.join(f).display().to_string();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority: {ca}
users:
- name: admin
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: test
  context: {{cluster: test, user: admin}}
current-context: test
",
        ca = p("ca.crt"),
        crt = p("admin.crt"),
        key = p("admin.key"),
    )
}

/// Spawns `cmd` with its output in `log`, from the one long-lived spawner thread.
pub(crate) fn spawn_logged(mut cmd: Command, log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let program = cmd.get_program().to_owned();
    spawner()
        .lock()
        .unwrap()
        .call(cmd)
        .with_context(|| format!("starting {}", program.display()))
}

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

struct Spawner(mpsc::Sender<Request>);

impl Spawner {
    fn call(&self, cmd: Command) -> anyhow::Result<Child> {
        let (tx, rx) = mpsc::channel();
        self.0
            .send((cmd, tx))
            .map_err(|_| anyhow::anyhow!("spawner thread gone"))?;
        Ok(rx
            .recv()
            .map_err(|_| anyhow::anyhow!("spawner thread gone"))??)
    }
}

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, and each test runs on
/// a thread of its own: so every child is forked by this thread, which never ends.
fn spawner() -> &'static Mutex<Spawner> {
    static SPAWNER: OnceLock<Mutex<Spawner>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the control-plane spawner thread");
        Mutex::new(Spawner(tx))
    })
}

/// Standard base64 with padding, for etcd's JSON gateway.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One POST to etcd's JSON gateway; the body of a 200 answer.
fn etcd_post(port: u16, path: &str, body: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    // A defragmentation of a multi-GiB database takes longer than a range.
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    anyhow::ensure!(head.contains(" 200 "), "etcd {path}: {out}");
    Ok(body.to_string())
}

/// Cargo runs a test or a bench in its package's directory, but the documented commands are
/// typed at the repository root: a relative path is taken from there, as the one typing it
/// meant.
fn from_repo_root(p: PathBuf) -> PathBuf {
    if p.is_relative() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
    } else {
        p
    }
}
