//! Records in a DynamoDB table, shared by every guard that points at it.
//!
//! One item per key (`wit/store-layout/README.md`, DynamoDB), each
//! primitive one conditional request, so one round trip:
//!
//! - a claim is an `UpdateItem` that writes the record only if the key is
//!   absent or its record expired (`attribute_not_exists(key) OR
//!   expires_at_ms <= :now`), its version `if_not_exists(version, 0) + 1`;
//!   when the condition fails, DynamoDB answers the live item with the
//!   failure (`ReturnValuesOnConditionCheckFailure = ALL_OLD`): a replay is
//!   one request that writes nothing.
//! - a completion is a `PutItem` of the whole record at `expected + 1` on
//!   the condition `version = :expected AND expires_at_ms > :now`; a release
//!   a `DeleteItem` on the same kind of condition.
//! - a read is a strongly consistent `GetItem`, filtered by expiry: the TTL
//!   attribute (`ttl`) lets DynamoDB delete expired items by itself, within
//!   days, so reads never rely on it.
//!
//! The time authority is AWS's clock as the `Date` header of DynamoDB's
//! responses states it, in whole seconds ([`SyncedClock::with_resolution`]):
//! hosts agree to within about a second (half a second each, plus half
//! their round trips), so leases must be far longer than that.
//!
//! The table (`idem_records` unless `?table=`) is created on first open if
//! absent (on-demand capacity, partition key `key` a string, TTL on `ttl`).
//!
//! URL: `dynamodb://HOST:PORT?table=T&region=R` for a DynamoDB-compatible
//! server over plain HTTP (DynamoDB Local, moto; credentials from the
//! `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` variables, or dummy ones:
//! such servers check none), `dynamodb+https://HOST[:PORT]?…` for another
//! HTTPS endpoint, `dynamodb://?table=T[&region=R]` for AWS's endpoint of
//! the region; these two take credentials and (without `region=`) the region
//! from the SDK's standard chain (variables, profile files, web identity,
//! containers, instance metadata). Also `timeout_ms` (per request, default
//! 2000) and `clock_sync_ms`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::store::{DynamoDbStore, Store};
//! let store = DynamoDbStore::open("dynamodb://127.0.0.1:8000?table=idem&region=us-east-1").await?;
//! assert_eq!(store.name(), "dynamodb");
//! # Ok(()) }
//! ```

mod item;

use super::codec::{corrupt, unavailable};
use super::params::StoreUrl;
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, Result, Store};
use crate::clock::{Clock, SyncedClock, Syncing};
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
    SharedCredentialsProvider,
};
use aws_sdk_dynamodb::error::{BoxError, DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::{DateTime, DateTimeFormat};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableDescription, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use item::{EXPIRES_AT_MS, Item, KEY, STATE, TTL, VERSION, decode, n, number};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NAME: &str = "dynamodb";

/// The key the clock reads (an eventually consistent `GetItem` whose
/// answer is never used, only its `Date`): no idem key holds a control
/// character, so it is never a record.
const CLOCK_KEY: &str = "\u{1}clock";

/// How long `open` waits for a table it created to become active.
const TABLE_ACTIVE_WITHIN: Duration = Duration::from_mins(2);

/// A store on a DynamoDB table. Cheap to clone: clones share the client.
#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: Arc<str>,
    timeout: Duration,
    /// AWS's clock from the `Date` of DynamoDB's responses; kept synced
    /// while any clone holds `_syncing`.
    clock: Arc<SyncedClock>,
    _syncing: Arc<Syncing>,
}

/// Where the requests go.
enum Endpoint {
    /// A DynamoDB-compatible server over plain HTTP (a test's, a local one).
    Local(String),
    /// Another HTTPS endpoint (a VPC endpoint, a proxy).
    Https(String),
    /// AWS's own endpoint for the region.
    Aws,
}

impl DynamoDbStore {
    /// Connects, creates the table if it is absent and reads the clock.
    /// Fails when the endpoint cannot be reached now; after that, each
    /// operation fails as unavailable while it cannot.
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(url, &["table", "region", "timeout_ms", "clock_sync_ms"])?;
        let clock_sync = url.clock_sync()?;
        let timeout = url.timeout()?;
        let bad = |reason: String| OpenError::BadUrl {
            url: url.shown.clone(),
            reason,
        };
        let unreachable = |reason: String| OpenError::Unreachable {
            store: NAME,
            url: url.shown.clone(),
            reason,
        };
        let (endpoint, query) = url.driver.split_once('?').unwrap_or((&url.driver, ""));
        if !query.is_empty() {
            return Err(bad(format!(
                "unknown dynamodb option {query:?}; the options are table, region, timeout_ms and clock_sync_ms"
            )));
        }
        let endpoint = match endpoint.split_once("://") {
            Some(("dynamodb", "" | "/")) => Endpoint::Aws,
            Some(("dynamodb", host)) => {
                Endpoint::Local(format!("http://{}", host.trim_end_matches('/')))
            }
            Some(("dynamodb+https", host)) if !host.is_empty() => {
                Endpoint::Https(format!("https://{}", host.trim_end_matches('/')))
            }
            _ => {
                return Err(bad(
                    "expected dynamodb://HOST:PORT (plain HTTP), dynamodb+https://HOST[:PORT] or dynamodb:// (AWS)".into(),
                ));
            }
        };
        let table = url.get("table").unwrap_or("idem_records").to_owned();
        if !(3..=255).contains(&table.len())
            || !table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(bad(format!(
                "table={table:?} must be 3 to 255 characters of a-z, A-Z, 0-9, _, - and ."
            )));
        }
        let client = client(&endpoint, url.get("region"), timeout).await;
        let setup = ensure_table(&client, &table);
        tokio::time::timeout(TABLE_ACTIVE_WITHIN + timeout, setup)
            .await
            .map_err(|_| unreachable(format!("the table {table:?} did not become active in time")))?
            .map_err(unreachable)?;
        // The time authority: AWS's clock from the `Date` header, read once
        // now (a store whose clock is unknown fails every guard call closed)
        // and every second after.
        let clock = SyncedClock::with_resolution(
            "AWS's clock, from the Date header of DynamoDB's responses (whole seconds)",
            1_000,
        );
        let table: Arc<str> = table.into();
        let syncing = clock
            .start_syncing(
                clock_sync,
                (client.clone(), table.clone(), timeout),
                server_time,
            )
            .await
            .map_err(unreachable)?;
        Ok(DynamoDbStore {
            client,
            table,
            timeout,
            clock,
            _syncing: syncing,
        })
    }

    /// `run` within the timeout. Boxed: the SDK's request futures are
    /// about 20 KB each, too large to carry inline through every caller.
    fn within_timeout<T>(
        &self,
        run: impl Future<Output = Result<T>> + Send,
    ) -> impl Future<Output = Result<T>> + Send {
        let (run, timeout) = (Box::pin(run), self.timeout);
        async move {
            within(timeout, run)
                .await
                .unwrap_or_else(|late| Err(unavailable(NAME, late)))
        }
    }
}

async fn within<T>(timeout: Duration, run: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))
}

/// The SDK's client for `endpoint`: rustls with ring, no retries (a write
/// whose answer was lost may have been applied: the guard decides what
/// follows, as with every store), each request bounded by `timeout`.
async fn client(endpoint: &Endpoint, region: Option<&str>, timeout: Duration) -> Client {
    use aws_sdk_dynamodb::config::retry::RetryConfig;
    use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(timeout)
        .operation_attempt_timeout(timeout)
        .build();
    let config = match endpoint {
        // Only what the URL and the environment say: no profile files, no
        // instance metadata (a test machine has none, and must not ask).
        Endpoint::Local(address) => {
            let credentials = Credentials::new(
                std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "idem".into()),
                std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "idem".into()),
                None,
                None,
                "idem (environment or dummy)",
            );
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .endpoint_url(address)
                .region(Region::new(region.unwrap_or("us-east-1").to_owned()))
                .credentials_provider(SharedCredentialsProvider::new(credentials))
                .http_client(http)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build()
        }
        Endpoint::Https(_) | Endpoint::Aws => {
            let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http);
            if let Some(region) = region {
                loader = loader.region(Region::new(region.to_owned()));
            }
            if let Endpoint::Https(address) = endpoint {
                loader = loader.endpoint_url(address);
            }
            let shared = loader.load().await;
            aws_sdk_dynamodb::config::Builder::from(&shared)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build()
        }
    };
    Client::from_conf(config)
}

/// Creates the table if it is absent, waits for it to be active, and turns
/// on its TTL on `ttl`; refuses a table keyed otherwise.
async fn ensure_table(client: &Client, table: &str) -> Result<(), String> {
    let described = client.describe_table().table_name(table).send().await;
    match described {
        Ok(out) => {
            let schema = out
                .table()
                .map(TableDescription::key_schema)
                .unwrap_or_default();
            let keyed_by_key = schema.len() == 1 && schema[0].attribute_name() == KEY;
            if !keyed_by_key {
                return Err(format!(
                    "the table {table:?} exists with another key; idem needs a table whose partition key is the string {KEY:?} and nothing else"
                ));
            }
        }
        Err(e)
            if e.as_service_error()
                .is_some_and(DescribeTableError::is_resource_not_found_exception) =>
        {
            let created = client
                .create_table()
                .table_name(table)
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(KEY)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .map_err(|e| e.to_string())?,
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(KEY)
                        .key_type(KeyType::Hash)
                        .build()
                        .map_err(|e| e.to_string())?,
                )
                .billing_mode(BillingMode::PayPerRequest)
                .send()
                .await;
            match created {
                Ok(_) => {}
                // Another host created it first.
                Err(e)
                    if e.as_service_error()
                        .is_some_and(CreateTableError::is_resource_in_use_exception) => {}
                Err(e) => return Err(format!("creating the table {table:?}: {}", describe(&e))),
            }
        }
        Err(e) => return Err(describe(&e)),
    }
    // A table just created is CREATING for a few seconds on AWS.
    let mut wait = Duration::from_millis(100);
    loop {
        let out = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            break;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
    let ttl = client
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
        .map_err(|e| describe(&e))?;
    let ttl = ttl.time_to_live_description();
    match (
        ttl.and_then(|t| t.time_to_live_status()),
        ttl.and_then(|t| t.attribute_name()),
    ) {
        (Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling), Some(TTL)) => Ok(()),
        (Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling), Some(other)) => {
            Err(format!(
                "the table {table:?} has its TTL on {other:?}; idem's records expire by {TTL:?}"
            ))
        }
        _ => client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(TTL)
                    .build()
                    .map_err(|e| e.to_string())?,
            )
            .send()
            .await
            .map(|_| ())
            .map_err(|e| format!("turning on the TTL of {table:?}: {}", describe(&e))),
    }
}

/// Keeps the `Date` header of the response it sees; clones share it.
#[derive(Clone, Debug, Default)]
struct DateHeader(Arc<Mutex<Option<String>>>);

impl Intercept for DateHeader {
    fn name(&self) -> &'static str {
        "idem's Date header reader"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let date = context.response().headers().get("date").map(str::to_owned);
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = date;
        Ok(())
    }
}

/// An HTTP `Date` (`Mon, 08 Dec 2025 05:46:40 GMT`) in milliseconds since
/// the Unix epoch: its second's start.
fn date_ms(date: &str) -> Result<u64, String> {
    let time = DateTime::from_str(date, DateTimeFormat::HttpDate)
        .map_err(|e| format!("the Date header {date:?} does not parse: {e}"))?;
    u64::try_from(time.secs())
        .map(|s| s * 1_000)
        .map_err(|_| format!("the Date header {date:?} is before 1970"))
}

/// AWS's time as a DynamoDB response dates it (whole seconds), within
/// `timeout`: an eventually consistent read of [`CLOCK_KEY`], the cheapest
/// request there is (half a read unit).
async fn server_time(
    (client, table, timeout): (Client, Arc<str>, Duration),
) -> Result<u64, String> {
    let date = DateHeader::default();
    let ask = client
        .get_item()
        .table_name(&*table)
        .key(KEY, AttributeValue::S(CLOCK_KEY.into()))
        .projection_expression("#k")
        .expression_attribute_names("#k", KEY)
        .customize()
        .interceptor(date.clone())
        .send();
    within(timeout, ask).await?.map_err(|e| describe(&e))?;
    let header = date
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    date_ms(&header.ok_or("the response has no Date header")?)
}

/// A conditional write's answer: `true` when it was applied, `false` when
/// its condition did not hold (`refused` tells that error), unavailable
/// otherwise.
fn written<T, E: std::error::Error + 'static, R: std::fmt::Debug>(
    sent: std::result::Result<T, SdkError<E, R>>,
    refused: fn(&E) -> bool,
) -> Result<bool> {
    match sent {
        Ok(_) => Ok(true),
        Err(e) if e.as_service_error().is_some_and(refused) => Ok(false),
        Err(e) => Err(unavailable(NAME, describe(&e))),
    }
}

/// The SDK's error with its causes (its `Display` alone says "service error").
fn describe<E: std::error::Error + 'static, R: std::fmt::Debug>(e: &SdkError<E, R>) -> String {
    DisplayErrorContext(e).to_string()
}

/// `#name` for each name (the layout's names are also DynamoDB's reserved
/// words: `key`, `state`, `status`, `ttl`, …).
fn names(names: &[&str]) -> HashMap<String, String> {
    names
        .iter()
        .map(|n| (format!("#{n}"), (*n).to_owned()))
        .collect()
}

#[async_trait]
impl Store for DynamoDbStore {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        let out = self
            .within_timeout(async {
                self.client
                    .get_item()
                    .table_name(&*self.table)
                    .key(KEY, AttributeValue::S(key.into()))
                    .consistent_read(true)
                    .send()
                    .await
                    .map_err(|e| unavailable(NAME, describe(&e)))
            })
            .await?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let entry = decode(key, item)?;
        Ok((entry.record.expires_at_ms > now_ms).then_some(entry))
    }

    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        let attributes = item::record_attributes(&record);
        let mut assignments = vec![format!(
            "#{VERSION} = if_not_exists(#{VERSION}, :zero) + :one"
        )];
        let mut removals = Vec::new();
        let mut named = vec![KEY, VERSION, EXPIRES_AT_MS];
        let mut values = HashMap::from([
            (":zero".to_owned(), n(0)),
            (":one".to_owned(), n(1)),
            (":now".to_owned(), n(now_ms)),
        ]);
        for name in [
            item::FINGERPRINT,
            STATE,
            item::LEASE_UNTIL_MS,
            EXPIRES_AT_MS,
            TTL,
            item::HOLDER,
        ]
        .into_iter()
        .chain(item::OPTIONAL)
        {
            if !named.contains(&name) {
                named.push(name);
            }
            match attributes.get(name) {
                Some(value) => {
                    assignments.push(format!("#{name} = :{name}"));
                    values.insert(format!(":{name}"), value.clone());
                }
                None => removals.push(format!("#{name}")),
            }
        }
        let mut update = format!("SET {}", assignments.join(", "));
        if !removals.is_empty() {
            update = format!("{update} REMOVE {}", removals.join(", "));
        }
        let sent = self
            .within_timeout(async {
                Ok(self
                    .client
                    .update_item()
                    .table_name(&*self.table)
                    .key(KEY, AttributeValue::S(key.into()))
                    .update_expression(update)
                    .condition_expression(format!(
                        "attribute_not_exists(#{KEY}) OR #{EXPIRES_AT_MS} <= :now"
                    ))
                    .set_expression_attribute_names(Some(names(&named)))
                    .set_expression_attribute_values(Some(values))
                    .return_values(ReturnValue::UpdatedNew)
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .send()
                    .await)
            })
            .await?;
        match sent {
            Ok(out) => {
                let written = out.attributes().cloned().unwrap_or_default();
                let version = number(&written, VERSION)
                    .map_err(|why| unavailable(NAME, format!("the claim's answer: {why}")))?;
                Ok(InsertOutcome::Inserted(version))
            }
            Err(e) => {
                use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
                let Some(UpdateItemError::ConditionalCheckFailedException(failed)) =
                    e.as_service_error()
                else {
                    return Err(unavailable(NAME, describe(&e)));
                };
                // The key holds a record that is not expired: the live one.
                let live = failed.item().ok_or_else(|| {
                    unavailable(
                        NAME,
                        "the claim's condition failed but DynamoDB returned no item (ReturnValuesOnConditionCheckFailure unsupported?)",
                    )
                })?;
                let entry = decode(key, live)?;
                if entry.record.expires_at_ms <= now_ms {
                    // Only an attribute of another type fails the condition so.
                    return Err(corrupt(
                        NAME,
                        key,
                        "its expires_at_ms is not a number DynamoDB compares",
                    ));
                }
                Ok(InsertOutcome::Existing(entry))
            }
        }
    }

    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        let Some(next) = expected.checked_add(1) else {
            return Ok(false);
        };
        let sent = self
            .within_timeout(async {
                Ok(self
                    .client
                    .put_item()
                    .table_name(&*self.table)
                    .set_item(Some(item::encode(key, next, &record)))
                    .condition_expression(format!(
                        "#{VERSION} = :expected AND #{EXPIRES_AT_MS} > :now"
                    ))
                    .set_expression_attribute_names(Some(names(&[VERSION, EXPIRES_AT_MS])))
                    .expression_attribute_values(":expected", n(expected))
                    .expression_attribute_values(":now", n(now_ms))
                    .send()
                    .await)
            })
            .await?;
        written(sent, PutItemError::is_conditional_check_failed_exception)
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        let mut values = HashMap::from([(":now".to_owned(), n(now_ms))]);
        let (condition, named) = match expected_version {
            None => (format!("#{EXPIRES_AT_MS} > :now"), vec![EXPIRES_AT_MS]),
            Some(version) => {
                values.insert(":expected".into(), n(version));
                (
                    format!("#{EXPIRES_AT_MS} > :now AND #{VERSION} = :expected"),
                    vec![EXPIRES_AT_MS, VERSION],
                )
            }
        };
        self.conditional_delete(key, condition, &named, values)
            .await
    }

    /// AWS's clock from DynamoDB's `Date` headers, read every second.
    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// A scan of the whole table (DynamoDB keeps no key order), sorted here:
    /// for operators' occasional pages, not for a request path.
    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        let mut filter = vec![format!("#{EXPIRES_AT_MS} > :now")];
        let mut named = vec![EXPIRES_AT_MS];
        let mut values = HashMap::from([(":now".to_owned(), n(now_ms))]);
        if !query.prefix.is_empty() {
            filter.push(format!("begins_with(#{KEY}, :prefix)"));
            values.insert(":prefix".into(), AttributeValue::S(query.prefix.clone()));
            named.push(KEY);
        }
        if let Some(after) = &query.after {
            filter.push(format!("#{KEY} > :after"));
            values.insert(":after".into(), AttributeValue::S(after.clone()));
            if !named.contains(&KEY) {
                named.push(KEY);
            }
        }
        if let Some(state) = query.state {
            filter.push(format!("#{STATE} = :state"));
            values.insert(":state".into(), AttributeValue::S(state.as_str().into()));
            named.push(STATE);
        }
        let items = self
            .scan(&filter.join(" AND "), &named, values, None)
            .await?;
        let mut found = items
            .iter()
            .map(|item| {
                let key = match item.get(KEY) {
                    Some(AttributeValue::S(key)) => key.clone(),
                    _ => return Err(unavailable(NAME, "an item's key is not a string")),
                };
                decode(&key, item).map(|entry| (key, entry))
            })
            .collect::<Result<Vec<_>>>()?;
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.truncate(query.limit);
        Ok(found)
    }

    /// A scan for expired items, each then deleted on the condition that it
    /// is still the expired one seen. Space is freed by DynamoDB's TTL as
    /// well: this is for operators who want it now.
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        let values = HashMap::from([(":now".to_owned(), n(now_ms))]);
        let expired = self
            .scan(
                &format!("#{EXPIRES_AT_MS} <= :now"),
                &[EXPIRES_AT_MS],
                values,
                Some(limit),
            )
            .await?;
        let mut purged = 0;
        for item in expired.iter().take(limit) {
            let (Some(AttributeValue::S(key)), Ok(version)) =
                (item.get(KEY), number(item, VERSION))
            else {
                continue; // not a record of this layout: not the purge's to remove
            };
            let condition = format!("#{VERSION} = :expected AND #{EXPIRES_AT_MS} <= :now");
            let values = HashMap::from([
                (":expected".to_owned(), n(version)),
                (":now".to_owned(), n(now_ms)),
            ]);
            if self
                .conditional_delete(key, condition, &[VERSION, EXPIRES_AT_MS], values)
                .await?
            {
                purged += 1;
            }
        }
        Ok(purged)
    }

    /// DynamoDB deletes expired items by their TTL attribute.
    fn purges_itself(&self) -> bool {
        true
    }
}

impl DynamoDbStore {
    /// `DeleteItem` on `condition`; whether it deleted.
    async fn conditional_delete(
        &self,
        key: &str,
        condition: String,
        named: &[&str],
        values: HashMap<String, AttributeValue>,
    ) -> Result<bool> {
        let sent = self
            .within_timeout(async {
                Ok(self
                    .client
                    .delete_item()
                    .table_name(&*self.table)
                    .key(KEY, AttributeValue::S(key.into()))
                    .condition_expression(condition)
                    .set_expression_attribute_names(Some(names(named)))
                    .set_expression_attribute_values(Some(values))
                    .send()
                    .await)
            })
            .await?;
        written(sent, DeleteItemError::is_conditional_check_failed_exception)
    }

    /// Every item matching `filter` (a strongly consistent scan, page after
    /// page), or the first `enough` of them.
    async fn scan(
        &self,
        filter: &str,
        named: &[&str],
        values: HashMap<String, AttributeValue>,
        enough: Option<usize>,
    ) -> Result<Vec<Item>> {
        let mut found = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let page = self
                .within_timeout(async {
                    self.client
                        .scan()
                        .table_name(&*self.table)
                        .consistent_read(true)
                        .filter_expression(filter)
                        .set_expression_attribute_names(Some(names(named)))
                        .set_expression_attribute_values(Some(values.clone()))
                        .set_exclusive_start_key(start.take())
                        .send()
                        .await
                        .map_err(|e| unavailable(NAME, describe(&e)))
                })
                .await?;
            found.extend(page.items().iter().cloned());
            start = page.last_evaluated_key().cloned();
            if start.is_none() || enough.is_some_and(|enough| found.len() >= enough) {
                return Ok(found);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::date_ms;
    use crate::store::codec::vectors::{file, u64_of};

    /// `wit/store-layout/vectors.json` (`time.dynamodb_date`).
    #[test]
    fn date_headers_read_as_their_seconds_start() {
        for v in file()["time"]["dynamodb_date"].as_array().unwrap() {
            assert_eq!(
                date_ms(v["date"].as_str().unwrap()),
                Ok(u64_of(&v["ms"])),
                "{v}"
            );
        }
    }
}
