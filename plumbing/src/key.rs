//! An object's key: its `namespace/name`, the one identity every component keys its stores,
//! queues and log lines by.
//!
//! One allocation per key, two words wide: PodGC keeps one for each of a cluster's pods.

use std::{cmp::Ordering, fmt, sync::Arc};

use kube::{Resource, ResourceExt};

/// An object's `namespace/name` in one allocation (a cluster-scoped object's namespace is
/// `""`). A namespace never holds a `/` (it is a DNS label), so the first `/` splits the two
/// (PodGC, which deletes by key, refuses a pod claiming such a namespace before keying it).
/// Ordered by namespace, then name; shown as `namespace/name` (a cluster-scoped object as its
/// name alone, as klog shows an object reference).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(format!("{namespace}/{name}").into())
    }

    /// The key of a watched object: its namespace (`""` when it has none) and name.
    pub fn of<K: Resource>(object: &K) -> Self {
        Self::new(&object.namespace().unwrap_or_default(), &object.name_any())
    }

    pub fn namespace(&self) -> &str {
        self.0.split_once('/').map_or("", |(ns, _)| ns)
    }

    pub fn name(&self) -> &str {
        self.0.split_once('/').map_or(&*self.0, |(_, name)| name)
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.namespace(), self.name()).cmp(&(other.namespace(), other.name()))
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.namespace() {
            "" => f.write_str(self.name()),
            _ => f.write_str(&self.0),
        }
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::ObjectMeta;

    use super::ObjectKey;

    #[test]
    fn parts_and_display() {
        let k = ObjectKey::new("ns", "p");
        assert_eq!((k.namespace(), k.name()), ("ns", "p"));
        assert_eq!(k.to_string(), "ns/p");
        assert_eq!(format!("{k:?}"), "\"ns/p\"");
        let cluster = ObjectKey::new("", "n");
        assert_eq!((cluster.namespace(), cluster.name()), ("", "n"));
    }

    #[test]
    fn two_words_wide() {
        assert_eq!(
            std::mem::size_of::<ObjectKey>(),
            2 * std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn ordered_by_namespace_then_name() {
        // As a `(namespace, name)` pair sorts, not as the joined string ('-' sorts before '/').
        let mut keys = [
            ObjectKey::new("a-b", "x"),
            ObjectKey::new("a", "z"),
            ObjectKey::new("a", "y"),
        ];
        keys.sort();
        let parts: Vec<_> = keys.iter().map(|k| (k.namespace(), k.name())).collect();
        assert_eq!(parts, [("a", "y"), ("a", "z"), ("a-b", "x")]);
    }

    #[test]
    fn of_an_object() {
        let pod = Pod {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("p".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ObjectKey::of(&pod), ObjectKey::new("ns", "p"));
        let node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ObjectKey::of(&node).to_string(), "n");
    }
}
