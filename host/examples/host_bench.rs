//! The cost of one guarded call — `begin` then `complete` on a new key,
//! through the component, over the memory store — printed as ns/op, for
//! `examples/bench-hosts.sh` to set beside the Node.js and Python hosts.
//!
//! `cargo run --release -p idem --example host_bench [OPS]`

use idem::{Decision, Guard, MemoryStore, Response};
use std::time::Instant;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let ops: u64 = std::env::args()
        .nth(1)
        .map_or(20_000, |n| n.parse().expect("OPS is a number"));
    let guard = Guard::builder(MemoryStore::new()).build().expect("guard");
    let response = Response {
        status: 200,
        headers: vec![("content-type".into(), b"text/plain".to_vec())],
        body: b"paid".to_vec(),
    };

    let call = |i: u64| {
        let guard = &guard;
        let response = response.clone();
        async move {
            let Ok(Decision::Proceed(claim)) =
                guard.begin(&format!("order-{i}"), "sku=A&qty=1").await
            else {
                panic!("a new key must proceed");
            };
            guard.complete(claim, response).await.1.expect("complete");
        }
    };
    for i in 0..ops / 10 {
        call(u64::MAX - i).await; // warm up: instances, caches
    }
    let start = Instant::now();
    for i in 0..ops {
        call(i).await;
    }
    let ns = start.elapsed().as_nanos() / u128::from(ops);
    println!("rust    wasmtime 48.0.8   begin+complete  {ops} ops  {ns} ns/op");
}
