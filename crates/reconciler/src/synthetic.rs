//! Synthetic clusters of any size, for `hapwright bench` and the renderer's criterion
//! benchmarks: the one generator both use, so their figures describe the same objects.
//!
//! Service `i` lives in namespace `team-{i % 10}` and has one EndpointSlice with three
//! endpoints (every seventh endpoint is not ready) and one Ingress routing
//! `svc-{i}.example.com` `/` and `/api` to it. Every fifth Service has the annotations
//! `haproxy.org/balance` and `haproxy.org/timeout-server`. There is one TLS Secret,
//! `default/tls`. For the Gateway API there is one GatewayClass `hapwright` (controller
//! [`GATEWAY_CONTROLLER`]), one Gateway `default/gateway` with an HTTP listener on 8080
//! and an HTTPS listener on 8443 (the Secret as certificate), both admitting routes from
//! every namespace, and per Service one HTTPRoute routing the same host, `/` and `/api`,
//! to it. The output is deterministic for a given size and [`Shape`].
//!
//! It lives here rather than in a test crate because `hapwright bench` (in the `app`
//! crate) generates clusters at run time, and `app` may depend on the reconciler but
//! not the other way round.

use serde_json::{Map, Value, json};

/// The kinds [`objects`] produces.
pub const KINDS: [&str; 7] = [
    "Service",
    "EndpointSlice",
    "Ingress",
    "Secret",
    "GatewayClass",
    "Gateway",
    "HTTPRoute",
];

/// The `controllerName` of the generated GatewayClass: the Gateway API library's
/// default `extraContext.gatewayControllerName`, so the library serves the cluster.
pub const GATEWAY_CONTROLLER: &str = "hapwright.io/gateway-controller";

/// The few details in which the two benchmarks' clusters differ. Each keeps its own
/// shape so its recorded figures stay comparable with earlier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Every Service carries `hapwright.io/host: svc-<i>.example.com` (first among its
    /// annotations).
    pub host_annotation: bool,
    /// EndpointSlices carry `addressType: IPv4`.
    pub address_type: bool,
    /// The Secret's `tls.crt`, base64 of a PEM certificate.
    pub tls_crt: &'static str,
    /// The Secret's `tls.key`, base64 of a PEM private key.
    pub tls_key: &'static str,
}

/// `n` objects of `kind` (one of [`KINDS`]; the Secret, the GatewayClass and the
/// Gateway are always one object, and any other kind gets none).
pub fn objects(kind: &str, n: usize, shape: &Shape) -> Vec<Value> {
    objects_iter(kind, n, shape).collect()
}

/// [`objects`], made one at a time as the iterator is read, so a caller that stores
/// each object as it comes never holds them all in their parsed form.
pub fn objects_iter<'a>(
    kind: &str,
    n: usize,
    shape: &'a Shape,
) -> Box<dyn Iterator<Item = Value> + 'a> {
    match kind {
        "Service" => Box::new((0..n).map(move |i| service(i, shape))),
        "EndpointSlice" => Box::new((0..n).map(move |i| endpoint_slice(i, shape))),
        "Ingress" => Box::new((0..n).map(ingress)),
        "HTTPRoute" => Box::new((0..n).map(http_route)),
        _ => Box::new(one_object(kind, shape).into_iter()),
    }
}

/// The kinds of which there is always one object, whatever the scale.
fn one_object(kind: &str, shape: &Shape) -> Vec<Value> {
    match kind {
        "Secret" => vec![json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"namespace": "default", "name": "tls"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": shape.tls_crt, "tls.key": shape.tls_key},
        })],
        "GatewayClass" => vec![json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "hapwright"},
            "spec": {"controllerName": GATEWAY_CONTROLLER},
        })],
        "Gateway" => vec![gateway()],
        _ => Vec::new(),
    }
}

fn namespace(i: usize) -> String {
    format!("team-{}", i % 10)
}

fn service(i: usize, shape: &Shape) -> Value {
    let mut annotations = Map::new();
    if shape.host_annotation {
        annotations.insert(
            "hapwright.io/host".to_owned(),
            json!(format!("svc-{i}.example.com")),
        );
    }
    if i.is_multiple_of(5) {
        annotations.insert("haproxy.org/balance".to_owned(), json!("leastconn"));
        annotations.insert("haproxy.org/timeout-server".to_owned(), json!("1m"));
    }
    let mut metadata = json!({"namespace": namespace(i), "name": format!("svc-{i}")});
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    })
}

fn endpoint_slice(i: usize, shape: &Shape) -> Value {
    let endpoints: Vec<Value> = (0..3)
        .map(|e| {
            let ordinal = i * 3 + e;
            json!({
                "addresses": [format!("10.{}.{}.{}", ordinal / 65536 % 256, ordinal / 256 % 256, ordinal % 256)],
                "conditions": {"ready": ordinal % 7 != 6},
                "targetRef": {"kind": "Pod", "name": format!("svc-{i}-pod-{e}")},
            })
        })
        .collect();
    let mut slice = Map::new();
    slice.insert("apiVersion".to_owned(), json!("discovery.k8s.io/v1"));
    slice.insert("kind".to_owned(), json!("EndpointSlice"));
    slice.insert(
        "metadata".to_owned(),
        json!({
            "namespace": namespace(i),
            "name": format!("svc-{i}-abcde"),
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")},
        }),
    );
    if shape.address_type {
        slice.insert("addressType".to_owned(), json!("IPv4"));
    }
    slice.insert("endpoints".to_owned(), Value::Array(endpoints));
    slice.insert(
        "ports".to_owned(),
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    );
    Value::Object(slice)
}

fn ingress(i: usize) -> Value {
    let backend = json!({"service": {"name": format!("svc-{i}"), "port": {"number": 80}}});
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"namespace": namespace(i), "name": format!("ing-{i}")},
        "spec": {"rules": [{
            "host": format!("Svc-{i}.Example.com"),
            "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": backend},
                {"path": "/api", "pathType": "Prefix", "backend": backend},
            ]},
        }]},
    })
}

fn gateway() -> Value {
    let all = json!({"namespaces": {"from": "All"}});
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"namespace": "default", "name": "gateway"},
        "spec": {
            "gatewayClassName": "hapwright",
            "listeners": [
                {"name": "http", "protocol": "HTTP", "port": 8080, "allowedRoutes": all},
                {"name": "https", "protocol": "HTTPS", "port": 8443, "allowedRoutes": all,
                 "tls": {"certificateRefs": [{"name": "tls"}]}},
            ],
        },
    })
}

fn http_route(i: usize) -> Value {
    let to = json!([{"name": format!("svc-{i}"), "port": 80}]);
    let prefix = |value: &str| json!([{"path": {"type": "PathPrefix", "value": value}}]);
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"namespace": namespace(i), "name": format!("route-{i}")},
        "spec": {
            "parentRefs": [{"name": "gateway", "namespace": "default"}],
            "hostnames": [format!("svc-{i}.example.com")],
            "rules": [
                {"matches": prefix("/"), "backendRefs": to},
                {"matches": prefix("/api"), "backendRefs": to},
            ],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        host_annotation: true,
        address_type: true,
        tls_crt: "crt",
        tls_key: "key",
    };

    #[test]
    fn the_shape_switches_only_its_own_details() {
        let plain = Shape {
            host_annotation: false,
            address_type: false,
            ..SHAPE
        };
        let services = objects("Service", 10, &plain);
        assert_eq!(services.len(), 10);
        // Only every fifth Service has annotations without the host annotation.
        let annotated = services
            .iter()
            .filter(|s| s["metadata"].get("annotations").is_some())
            .count();
        assert_eq!(annotated, 2);
        assert_eq!(
            objects("Service", 2, &SHAPE)[1]["metadata"]["annotations"],
            json!({"hapwright.io/host": "svc-1.example.com"})
        );
        assert!(
            objects("EndpointSlice", 1, &plain)[0]
                .get("addressType")
                .is_none()
        );
        assert_eq!(
            objects("EndpointSlice", 1, &SHAPE)[0]["addressType"],
            "IPv4"
        );
        assert_eq!(objects("Secret", 100, &SHAPE).len(), 1);
        assert_eq!(objects("Secret", 1, &SHAPE)[0]["data"]["tls.key"], "key");
        assert!(objects("ConfigMap", 5, &SHAPE).is_empty());
        assert_eq!(objects("Ingress", 3, &SHAPE), objects("Ingress", 3, &plain));
    }

    #[test]
    fn gateway_api_objects_route_every_service() {
        assert_eq!(objects("GatewayClass", 50, &SHAPE).len(), 1);
        assert_eq!(
            objects("GatewayClass", 1, &SHAPE)[0]["spec"]["controllerName"],
            GATEWAY_CONTROLLER
        );
        let gateways = objects("Gateway", 50, &SHAPE);
        assert_eq!(gateways.len(), 1);
        assert_eq!(
            gateways[0]["spec"]["listeners"][1]["tls"]["certificateRefs"][0]["name"],
            objects("Secret", 1, &SHAPE)[0]["metadata"]["name"]
        );
        let routes = objects("HTTPRoute", 12, &SHAPE);
        assert_eq!(routes.len(), 12);
        assert_eq!(routes[11]["metadata"]["namespace"], "team-1");
        assert_eq!(routes[11]["spec"]["hostnames"][0], "svc-11.example.com");
        assert_eq!(
            routes[11]["spec"]["rules"][1]["backendRefs"][0]["name"],
            objects("Service", 12, &SHAPE)[11]["metadata"]["name"]
        );
    }
}
