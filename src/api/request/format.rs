//! What the answer is held to: OpenAI's `response_format`, or llama.cpp's top-level
//! `json_schema` or GBNF `grammar` (one of the three per request).

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::Renamed;
use crate::engine::grammar::{gbnf, GRAMMAR_PARAM, SCHEMA_PARAM};
use crate::engine::ResponseFormat;
use crate::error::ApiError;

/// Struct variants, even empty ones: serde's `deny_unknown_fields` does not reach the
/// unit variants of an internally tagged enum, so `{"type": "text", "schema": ...}`
/// would pass unremarked.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[schema(as = ResponseFormat)]
pub(super) enum WireResponseFormat {
    Text {},
    JsonObject {},
    JsonSchema { json_schema: WireJsonSchema },
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = JsonSchemaFormat)]
pub(super) struct WireJsonSchema {
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    name: String,
    #[serde(default)]
    description: Option<String>,
    /// A JSON Schema object the answer must match.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    schema: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

/// What the answer is held to: OpenAI's `response_format`, or llama.cpp's `json_schema`
/// or `grammar` (one of them), with the parameter renamed where the engine's errors name
/// `response_format`'s.
pub(super) fn held_to(
    format: Option<WireResponseFormat>,
    json_schema: Option<Value>,
    grammar: Option<String>,
) -> Result<(ResponseFormat, Renamed), ApiError> {
    // llama.cpp reads an empty grammar as none.
    let grammar = grammar.filter(|g| !g.is_empty());
    let sent: Vec<&str> = [
        ("response_format", format.is_some()),
        ("json_schema", json_schema.is_some()),
        ("grammar", grammar.is_some()),
    ]
    .iter()
    .filter_map(|&(name, sent)| sent.then_some(name))
    .collect();
    if let [_, second, ..] = sent[..] {
        return Err(ApiError::invalid(
            second,
            format!("send only one of {}", sent.join(", ")),
        ));
    }
    if let Some(gbnf) = grammar {
        if let Err(e) = gbnf::to_lark(&gbnf) {
            return Err(ApiError::invalid(
                GRAMMAR_PARAM,
                format!("is not a GBNF grammar: {e}"),
            ));
        }
        return Ok((ResponseFormat::Grammar(gbnf), Vec::new()));
    }
    if let Some(schema) = json_schema {
        if !schema.is_object() {
            return Err(ApiError::invalid(
                "json_schema",
                "must be a JSON Schema object",
            ));
        }
        // The schema's own errors first, then any other naming `response_format`.
        return Ok((
            ResponseFormat::JsonSchema(schema),
            vec![
                (SCHEMA_PARAM, "json_schema"),
                ("response_format", "json_schema"),
            ],
        ));
    }
    Ok((response_format(format)?, Vec::new()))
}

/// OpenAI's `response_format`: text, any JSON object, or JSON held to a schema.
fn response_format(wire: Option<WireResponseFormat>) -> Result<ResponseFormat, ApiError> {
    Ok(match wire {
        None | Some(WireResponseFormat::Text {}) => ResponseFormat::Text,
        Some(WireResponseFormat::JsonObject {}) => ResponseFormat::JsonObject,
        Some(WireResponseFormat::JsonSchema { json_schema }) => {
            let name_ok = !json_schema.name.is_empty()
                && json_schema.name.len() <= 64
                && json_schema
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !name_ok {
                return Err(ApiError::invalid(
                    "response_format.json_schema.name",
                    "must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
                ));
            }
            let _ = (json_schema.description, json_schema.strict);
            let schema = json_schema
                .schema
                .unwrap_or_else(|| Value::Object(Map::new()));
            if !schema.is_object() {
                return Err(ApiError::invalid(
                    SCHEMA_PARAM,
                    "must be a JSON Schema object",
                ));
            }
            ResponseFormat::JsonSchema(schema)
        }
    })
}
