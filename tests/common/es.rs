//! An in-test Elasticsearch that speaks the parts of the real protocol llmgate uses,
//! modelled on the official API specification:
//!
//! - `PUT /_ilm/policy/{name}`, `PUT /_component_template/{name}`,
//!   `PUT /_index_template/{name}`: kept, answered `{"acknowledged":true}`.
//! - `POST /{target}/_bulk`: NDJSON (gzip decoded by actix-web), action/source pairs. Each
//!   item is answered in `items[]` with its status: 201 and `result: created` when kept
//!   (by `_id`), 409 `version_conflict_engine_exception` when the `_id` exists, or the
//!   status a test scripted (429 `es_rejected_execution_exception`, 400
//!   `document_parsing_exception`, 503 `unavailable_shards_exception`); `errors` is true
//!   when any item failed. A whole request can be scripted to fail (429 with
//!   `Retry-After`, 503, 413), and the server can go away and come back on the same port.

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

#[derive(Debug, Default)]
pub struct EsState {
    /// Documents kept, by `_id`.
    pub docs: HashMap<String, Value>,
    /// Bodies of the set-up PUTs, by path.
    pub setup: Vec<(String, Value)>,
    /// Every bulk request: query string, content encoding, ids in order.
    pub bulks: Vec<SeenBulk>,
    /// Statuses for the next items, in order (then 201).
    pub item_script: VecDeque<u16>,
    /// Statuses for the next whole bulk requests (then normal handling).
    pub request_script: VecDeque<u16>,
}

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

impl FakeEs {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let es = FakeEs {
            url: format!("http://127.0.0.1:{port}"),
            port,
            state: Arc::default(),
            handle: Mutex::new(None),
        };
        es.serve(listener);
        es
    }

    /// A URL where nothing listens yet; `come_back` starts the server there.
    pub fn not_yet() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
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
                .route("/_ilm/policy/{name}", web::put().to(setup))
                .route("/_component_template/{name}", web::put().to(setup))
                .route("/_index_template/{name}", web::put().to(setup))
                .route("/{target}/_bulk", web::post().to(bulk))
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
}

async fn setup(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<Mutex<EsState>>,
) -> HttpResponse {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => return error(400, "parse_exception", &e.to_string()),
    };
    state
        .lock()
        .expect("lock")
        .setup
        .push((req.path().to_owned(), value));
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
    if let Some(status) = s.request_script.pop_front() {
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
    let index = format!(
        ".ds{}-2026.11.30-000001",
        req.path().trim_end_matches("/_bulk")
    );
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
                json!({"_index": index, "_id": id, "status": 400, "error": {"type": "document_parsing_exception", "reason": "[1:42] failed to parse field [llm.ttft_ms] of type [double]"}})
            }
            other => {
                errors = true;
                json!({"_index": index, "_id": id, "status": other, "error": {"type": "unavailable_shards_exception", "reason": "primary shard is not active"}})
            }
        };
        items.push(json!({"create": item}));
    }
    HttpResponse::Ok().json(json!({"took": 3, "errors": errors, "items": items}))
}
