//! The generation routes' bodies as OpenAPI describes them. Each route reads one JSON
//! object twice, once as the fields both routes share ([`WireCommon`]) and once as its
//! own ([`WireChat`], [`WireCompletion`]); its schema is those two structs' schemas,
//! `allOf`, so what `/openapi.json` says is what the parser reads.

use utoipa::openapi::schema::{AllOfBuilder, Schema};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::chat::WireChat;
use super::completion::WireCompletion;
use super::WireCommon;

/// `POST /v1/chat/completions`.
pub struct ChatCompletionRequest;

/// `POST /v1/completions`.
pub struct CompletionRequest;

/// `allOf` the shared parameters and a route's own, by reference.
fn both<Own: ToSchema>() -> RefOr<Schema> {
    AllOfBuilder::new()
        .item(Ref::from_schema_name(WireCommon::name()))
        .item(Ref::from_schema_name(Own::name()))
        .into()
}

/// Registers the two parts (and what they refer to) as components.
fn parts<Own: ToSchema>(schemas: &mut Vec<(String, RefOr<Schema>)>) {
    for (name, schema) in [
        (WireCommon::name(), WireCommon::schema()),
        (Own::name(), Own::schema()),
    ] {
        schemas.push((name.into_owned(), schema));
    }
    WireCommon::schemas(schemas);
    Own::schemas(schemas);
}

/// `$route`'s body is `$own`'s fields and the shared ones: its schema is [`both`], its
/// components [`parts`].
macro_rules! route_body {
    ($route:ty => $own:ty) => {
        impl PartialSchema for $route {
            fn schema() -> RefOr<Schema> {
                both::<$own>()
            }
        }

        impl ToSchema for $route {
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                parts::<$own>(schemas);
            }
        }
    };
}

route_body!(ChatCompletionRequest => WireChat);
route_body!(CompletionRequest => WireCompletion);
