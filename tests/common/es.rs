//! An in-test Elasticsearch (or OpenSearch) that speaks the parts of the real protocol
//! llmgate uses, modelled on the official API specifications (Elasticsearch's
//! `elasticsearch-specification`, OpenSearch's `opensearch-api-specification`), one
//! [`Flavor`] per kind of cluster: what each accepts, refuses and answers.
//!
//! - `GET /`: the flavor's root (`version.number`, `build_flavor`, `distribution`).
//! - `PUT /_data_stream/{name}`: created, then 400 `resource_already_exists_exception`;
//!   a flavor without data streams has no handler for it.
//! - `PUT /_ilm/policy/{name}`, `PUT /_component_template/{name}`,
//!   `PUT /_index_template/{name}`: kept, answered `{"acknowledged":true}`.
//! - `POST /{target}/_bulk`: NDJSON (gzip decoded by actix-web), action/source pairs. Each
//!   item is answered in `items[]` with its status: 201 and `result: created` when kept
//!   (by `_id`), 409 `version_conflict_engine_exception` when the `_id` exists, or the
//!   status a test scripted (429 `es_rejected_execution_exception`, 400
//!   `document_parsing_exception`, OpenSearch's `mapper_parsing_exception`, 503 `unavailable_shards_exception`); `errors` is true
//!   when any item failed. A whole request can be scripted to fail (429 with
//!   `Retry-After`, 503, 413), and the server can go away and come back on the same port.

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

/// Which kind of cluster the stand-in plays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Flavor {
    /// Elasticsearch 9.1 (self-managed or hosted): ILM, the data stream lifecycle,
    /// `include_source_on_error` (since 8.18).
    #[default]
    Elasticsearch9,
    /// Elasticsearch 8.15: as 9, but `_bulk` refuses `include_source_on_error` (unknown
    /// parameters are refused: "contains unrecognized parameter").
    Elasticsearch815,
    /// Elastic Cloud Serverless (`build_flavor: serverless`): no ILM (410
    /// `api_not_available_exception`), no `index.lifecycle.name` setting; the data stream
    /// lifecycle.
    Serverless,
    /// OpenSearch 2.11: ISM (`_plugins/_ism`), data streams, no ILM, no data stream
    /// lifecycle, no `constant_keyword` (2.14+); every unknown parameter refused.
    OpenSearch2,
    /// A minimal Elasticsearch look-alike (as noida-db): templates and `_bulk`, no
    /// lifecycle API at all, no data stream API (a `create` makes a plain index).
    Minimal,
}

impl Flavor {
    fn root(self) -> Value {
        match self {
            Flavor::Elasticsearch9 => {
                json!({"name": "es", "cluster_name": "test", "version": {"number": "9.1.0", "build_flavor": "default"}, "tagline": "You Know, for Search"})
            }
            Flavor::Elasticsearch815 | Flavor::Minimal => {
                json!({"name": "es", "cluster_name": "test", "version": {"number": "8.15.3", "build_flavor": "default"}, "tagline": "You Know, for Search"})
            }
            Flavor::Serverless => {
                json!({"name": "serverless", "cluster_name": "project", "version": {"number": "8.11.0", "build_flavor": "serverless"}, "tagline": "You Know, for Search"})
            }
            Flavor::OpenSearch2 => {
                json!({"name": "os", "cluster_name": "test", "version": {"distribution": "opensearch", "number": "2.11.1"}, "tagline": "The OpenSearch Project: https://opensearch.org/"})
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct EsState {
    pub flavor: Flavor,
    /// Answer every set-up PUT 403, as for an API key that may only index.
    pub deny_setup: bool,
    /// Every set-up call, `METHOD path`, in order, answered or refused.
    pub calls: Vec<String>,
    /// Data streams created.
    pub data_streams: Vec<String>,
    /// Documents kept, by `_id`.
    pub docs: HashMap<String, Value>,
    /// Bodies of the set-up PUTs, by path.
    pub setup: Vec<(String, Value)>,
    /// Every bulk request: query string, content encoding, ids in order.
    pub bulks: Vec<SeenBulk>,
    /// Statuses for the next items, in order (then 201).
    pub item_script: VecDeque<u16>,
    /// Statuses for the next whole bulk requests (then normal handling). [`TOOK_IT`]:
    /// the documents are taken, and the answer is a 503 (a proxy's, after the cluster
    /// took the request).
    pub request_script: VecDeque<u16>,
    /// Every `ids` search: the ids asked for.
    pub searches: Vec<Vec<String>>,
}

/// A scripted whole-request status: take the documents, answer 503 (see
/// [`EsState::request_script`]).
pub const TOOK_IT: u16 = 599;

#[derive(Debug, Clone)]
pub struct SeenBulk {
    pub path: String,
    pub query: String,
    pub content_encoding: Option<String>,
    pub ids: Vec<String>,
}

pub struct FakeEs {
    pub url: String,
    port: u16,
    pub state: Arc<Mutex<EsState>>,
    handle: Mutex<Option<ServerHandle>>,
}

impl Drop for FakeEs {
    fn drop(&mut self) {
        // The stop command is sent when `stop` is called; see `TestServer`'s drop.
        if let Some(handle) = self.handle.get_mut().ok().and_then(Option::take) {
            drop(handle.stop(false));
        }
    }
}

impl FakeEs {
    pub async fn start() -> Self {
        Self::start_as(Flavor::default()).await
    }

    /// The stand-in playing `flavor`.
    pub async fn start_as(flavor: Flavor) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let es = FakeEs {
            url: format!("http://127.0.0.1:{port}"),
            port,
            state: Arc::new(Mutex::new(EsState {
                flavor,
                ..EsState::default()
            })),
            handle: Mutex::new(None),
        };
        es.serve(listener);
        es
    }

    /// A `flavor` at a URL where nothing listens yet; `come_back` starts it there.
    pub fn not_yet_as(flavor: Flavor) -> Self {
        let es = Self::not_yet();
        es.state.lock().expect("lock").flavor = flavor;
        es
    }

    /// A URL where nothing listens yet; `come_back` starts the server there.
    pub fn not_yet() -> Self {
        let port = super::free_port();
        FakeEs {
            url: format!("http://127.0.0.1:{port}"),
            port,
            state: Arc::default(),
            handle: Mutex::new(None),
        }
    }

    fn serve(&self, listener: TcpListener) {
        let state = web::Data::from(Arc::clone(&self.state));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(web::PayloadConfig::new(64 << 20))
                .route("/", web::get().to(root))
                .route("/_ilm/policy/{name}", web::put().to(setup))
                .route("/_plugins/_ism/policies/{name}", web::put().to(setup))
                .route("/_component_template/{name}", web::put().to(setup))
                .route("/_index_template/{name}", web::put().to(setup))
                .route("/_data_stream/{name}", web::put().to(create_data_stream))
                .route("/{target}/_bulk", web::post().to(bulk))
                .route("/{target}/_search", web::post().to(search))
                .route("/{target}/_refresh", web::post().to(refresh))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .listen(listener)
        .expect("listen")
        .run();
        *self.handle.lock().expect("lock") = Some(server.handle());
        tokio::spawn(server);
    }

    /// Stops answering: connections are refused until [`FakeEs::come_back`].
    pub async fn go_away(&self) {
        let handle = self.handle.lock().expect("lock").take();
        if let Some(handle) = handle {
            handle.stop(false).await;
        }
    }

    /// Listens again on the same port, with the documents it had.
    pub fn come_back(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).expect("rebind");
        self.serve(listener);
    }

    pub fn doc_count(&self) -> usize {
        self.state.lock().expect("lock").docs.len()
    }

    pub fn docs(&self) -> Vec<Value> {
        self.state
            .lock()
            .expect("lock")
            .docs
            .values()
            .cloned()
            .collect()
    }

    pub fn script_items(&self, statuses: &[u16]) {
        self.state
            .lock()
            .expect("lock")
            .item_script
            .extend(statuses);
    }

    pub fn script_requests(&self, statuses: &[u16]) {
        self.state
            .lock()
            .expect("lock")
            .request_script
            .extend(statuses);
    }

    pub fn bulks(&self) -> Vec<SeenBulk> {
        self.state.lock().expect("lock").bulks.clone()
    }

    /// The ids each `ids` search asked for, in order.
    pub fn searches(&self) -> Vec<Vec<String>> {
        self.state.lock().expect("lock").searches.clone()
    }
}

/// `_search` with an `ids` query, as the gateway asks which documents a data stream
/// holds: the hits among the documents kept, without their source.
async fn search(body: web::Bytes, state: web::Data<Mutex<EsState>>) -> HttpResponse {
    let mut s = state.lock().expect("lock");
    let query: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let ids: Vec<String> = query["query"]["ids"]["values"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let hits: Vec<Value> = ids
        .iter()
        .filter(|id| s.docs.contains_key(*id))
        .map(|id| json!({"_index": ".ds-logs-x-000001", "_id": id, "_score": 1.0}))
        .collect();
    s.searches.push(ids);
    HttpResponse::Ok().json(json!({"took": 1, "timed_out": false,
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {"max_score": 1.0, "hits": hits}}))
}

async fn refresh() -> HttpResponse {
    HttpResponse::Ok().json(json!({"_shards": {"total": 1, "successful": 1, "failed": 0}}))
}

async fn root(state: web::Data<Mutex<EsState>>) -> HttpResponse {
    let mut s = state.lock().expect("lock");
    s.calls.push("GET /".into());
    HttpResponse::Ok().json(s.flavor.root())
}

/// Elasticsearch's (and OpenSearch's) answer to a route it does not have.
fn no_handler(req: &HttpRequest) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({"error": format!("no handler found for uri [{}] and method [{}]", req.path(), req.method())}))
}

async fn setup(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<Mutex<EsState>>,
) -> HttpResponse {
    let mut s = state.lock().expect("lock");
    let path = req.path().to_owned();
    s.calls.push(format!("PUT {path}"));
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => return error(400, "parse_exception", &e.to_string()),
    };
    if s.deny_setup {
        return error(403, "security_exception", "action [cluster:admin/settings/update] is unauthorized for API key id [k1] of user [llmgate]");
    }
    let flavor = s.flavor;
    let ilm = path.starts_with("/_ilm/");
    let ism = path.starts_with("/_plugins/_ism/");
    match flavor {
        Flavor::Serverless if ilm => {
            let reason = format!("Request for uri [{path}] with method [PUT] exists but is not available when running in serverless mode");
            return error(410, "api_not_available_exception", &reason);
        }
        Flavor::OpenSearch2 | Flavor::Minimal if ilm => return no_handler(&req),
        f if ism && f != Flavor::OpenSearch2 => return no_handler(&req),
        _ => {}
    }
    let template = &value["template"];
    let lifecycle_setting = !template["settings"]["index.lifecycle.name"].is_null();
    if lifecycle_setting && matches!(flavor, Flavor::Serverless | Flavor::OpenSearch2) {
        return error(400, "settings_exception", "unknown setting [index.lifecycle.name] please check that any required plugins are installed, or check the breaking changes documentation for removed settings");
    }
    if !template["lifecycle"].is_null() && flavor == Flavor::OpenSearch2 {
        return error(
            400,
            "x_content_parse_exception",
            "[1:120] [template] unknown field [lifecycle]",
        );
    }
    if flavor == Flavor::OpenSearch2 && value.to_string().contains("constant_keyword") {
        return error(
            400,
            "mapper_parsing_exception",
            "No handler for type [constant_keyword] declared on field [type]",
        );
    }
    if ism && s.setup.iter().any(|(p, _)| *p == path) {
        // ISM updates need the policy's sequence number.
        return error(
            409,
            "version_conflict_engine_exception",
            "[llmgate-requests]: version conflict, document already exists (current version [1])",
        );
    }
    s.setup.push((path, value));
    HttpResponse::Ok().json(json!({"acknowledged": true}))
}

async fn create_data_stream(
    req: HttpRequest,
    name: web::Path<String>,
    state: web::Data<Mutex<EsState>>,
) -> HttpResponse {
    let mut s = state.lock().expect("lock");
    s.calls.push(format!("PUT {}", req.path()));
    if s.flavor == Flavor::Minimal {
        return no_handler(&req);
    }
    let name = name.into_inner();
    if s.data_streams.contains(&name) {
        let reason = format!("data_stream [{name}] already exists");
        return error(400, "resource_already_exists_exception", &reason);
    }
    s.data_streams.push(name);
    HttpResponse::Ok().json(json!({"acknowledged": true}))
}

fn error(status: u16, kind: &str, reason: &str) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("status"))
        .json(json!({"error": {"root_cause": [{"type": kind, "reason": reason}], "type": kind, "reason": reason}, "status": status}))
}

async fn bulk(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<Mutex<EsState>>,
) -> HttpResponse {
    let mut s = state.lock().expect("lock");
    let text = String::from_utf8_lossy(&body).into_owned();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    let ids: Vec<String> = lines
        .iter()
        .step_by(2)
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .and_then(|a| a["create"]["_id"].as_str().map(str::to_owned))
                .unwrap_or_default()
        })
        .collect();
    s.bulks.push(SeenBulk {
        path: req.path().to_owned(),
        query: req.query_string().to_owned(),
        content_encoding: req
            .headers()
            .get("content-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        ids: ids.clone(),
    });
    // Both refuse query parameters they do not know; include_source_on_error is 8.18's.
    let refuses_source_flag = matches!(s.flavor, Flavor::Elasticsearch815 | Flavor::OpenSearch2);
    if refuses_source_flag && req.query_string().contains("include_source_on_error") {
        let reason = format!(
            "request [{}] contains unrecognized parameter: [include_source_on_error]",
            req.path()
        );
        return error(400, "illegal_argument_exception", &reason);
    }
    let took_it = s.request_script.front() == Some(&TOOK_IT);
    if took_it {
        s.request_script.pop_front();
    } else if let Some(status) = s.request_script.pop_front() {
        return match status {
            429 => HttpResponse::TooManyRequests()
                .insert_header(("Retry-After", "0"))
                .json(json!({"error": {"type": "es_rejected_execution_exception", "reason": "rejected execution of coordinating operation"}, "status": 429})),
            413 => HttpResponse::PayloadTooLarge().finish(),
            other => error(other, "unavailable_shards_exception", "primary shard is not active"),
        };
    }
    if lines.len() % 2 != 0 {
        return error(
            400,
            "illegal_argument_exception",
            "The bulk request must be terminated by a newline [\\n]",
        );
    }
    // Backing indices and a refused document's error, as each names them: OpenSearch's
    // have no date and its parser says mapper_parsing_exception (checked against a real
    // OpenSearch 2.19 node, tests/python/test_semlog_opensearch.py).
    let stream = req.path().trim_end_matches("/_bulk");
    let opensearch = s.flavor == Flavor::OpenSearch2;
    let index = if opensearch {
        format!(".ds{stream}-000001")
    } else {
        format!(".ds{stream}-2026.11.30-000001")
    };
    let parse_error = if opensearch {
        json!({"type": "mapper_parsing_exception", "reason": "failed to parse field [llm.ttft_ms] of type [double] in document with id '1'. Preview of field's value: 'x'"})
    } else {
        json!({"type": "document_parsing_exception", "reason": "[1:42] failed to parse field [llm.ttft_ms] of type [double]"})
    };
    let mut items = Vec::new();
    let mut errors = false;
    for (pair, id) in lines.chunks(2).zip(ids) {
        let status = s.item_script.pop_front().unwrap_or(201);
        let item = match status {
            201 if s.docs.contains_key(&id) => {
                errors = true;
                json!({"_index": index, "_id": id, "status": 409, "error": {"type": "version_conflict_engine_exception", "reason": format!("[{id}]: version conflict, document already exists (current version [1])"), "index": index}})
            }
            201 => {
                let source: Value = serde_json::from_str(pair[1]).unwrap_or(Value::Null);
                s.docs.insert(id.clone(), source);
                json!({"_index": index, "_id": id, "_version": 1, "result": "created", "_shards": {"total": 1, "successful": 1, "failed": 0}, "_seq_no": 0, "_primary_term": 1, "status": 201})
            }
            429 => {
                errors = true;
                json!({"_index": index, "_id": id, "status": 429, "error": {"type": "es_rejected_execution_exception", "reason": "rejected execution of primary operation"}})
            }
            400 => {
                errors = true;
                json!({"_index": index, "_id": id, "status": 400, "error": parse_error.clone()})
            }
            other => {
                errors = true;
                json!({"_index": index, "_id": id, "status": other, "error": {"type": "unavailable_shards_exception", "reason": "primary shard is not active"}})
            }
        };
        items.push(json!({"create": item}));
    }
    if took_it {
        return error(503, "bad_gateway", "the proxy lost the cluster's answer");
    }
    HttpResponse::Ok().json(json!({"took": 3, "errors": errors, "items": items}))
}
