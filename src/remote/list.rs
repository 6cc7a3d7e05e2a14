//! The objects a source's URLs name, in the order given.
//!
//! A URL with glob characters (`*`, `?`, `[...]`, `[!...]`) in its object
//! key is matched against one listing of the key's directory: the glob's
//! characters never cross a `/` (`s3://b/train/*.tar` does not reach
//! `train/old/x.tar`), and the matches come sorted by key. Each directory is
//! listed once, however many patterns it serves. A URL without glob
//! characters is looked up with a HEAD, [`HEADS`] at a time, in order. A
//! plain HTTP server cannot be listed, so a glob there is refused (brace
//! ranges, expanded before this, name many files). A pattern that matches
//! nothing, or a missing object, is an error naming it.

use std::collections::HashMap;

use futures_util::StreamExt;

use super::store::{client, StorageOptions};
use super::url::{ObjectUrl, Scheme};
use super::{Object, RemoteError};

/// HEAD requests in flight at once.
pub const HEADS: usize = 16;

/// Characters that make a URL a glob pattern.
const GLOB: [char; 3] = ['*', '?', '['];

/// The objects `patterns` name, in order (see the [module docs](self)),
/// with the process's clients made with `options`.
///
/// # Errors
///
/// [`RemoteError::BadUrl`] for a URL of no store read here, a malformed glob
/// or a glob over HTTP; [`RemoteError::NotFound`] for a pattern that
/// matches nothing or a missing object; the store's error otherwise.
pub async fn objects(
    patterns: &[String],
    options: &StorageOptions,
) -> Result<Vec<Object>, RemoteError> {
    let mut out = Vec::new();
    let mut plain: Vec<ObjectUrl> = Vec::new();
    let mut listings: HashMap<String, Vec<Object>> = HashMap::new();
    for pattern in patterns {
        let Some((directory, glob)) = glob_of(pattern)? else {
            plain.push(ObjectUrl::parse(pattern)?);
            continue;
        };
        out.extend(heads(std::mem::take(&mut plain), options).await?);
        if !listings.contains_key(&directory) {
            let prefix = ObjectUrl::parse_prefix(&directory)?;
            let store = client(&prefix, options)?;
            let listed = Object::list(&*store, &prefix).await?;
            listings.insert(directory.clone(), listed);
        }
        let matched: Vec<Object> = listings[&directory]
            .iter()
            .filter(|o| glob.matches_with(o.url.path.as_ref(), MATCH))
            .cloned()
            .collect();
        if matched.is_empty() {
            return Err(RemoteError::NotFound {
                url: pattern.clone(),
                message: format!("no shard matches {pattern:?}"),
            });
        }
        out.extend(matched);
    }
    out.extend(heads(plain, options).await?);
    Ok(out)
}

/// How a key matches a glob: case and all, `*` and `?` within one path
/// segment.
const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// The directory to list and the glob over object keys of `pattern`, or
/// `None` when it has no glob characters.
fn glob_of(pattern: &str) -> Result<Option<(String, glob::Pattern)>, RemoteError> {
    let bad = |why: String| RemoteError::BadUrl {
        url: pattern.to_string(),
        why,
    };
    let Some((scheme, rest)) = pattern.split_once("://") else {
        return Ok(None);
    };
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(first) = key.find(GLOB) else {
        return Ok(None);
    };
    // The store's kind, and that it can be listed.
    let kind = match ObjectUrl::parse_prefix(&format!("{scheme}://{bucket}")) {
        Ok(store) => store.scheme,
        Err(RemoteError::BadUrl { why, .. }) => return Err(bad(why)),
        Err(other) => return Err(other),
    };
    if kind == Scheme::Http {
        return Err(bad(
            "a plain HTTP server cannot be listed: give the shards' URLs, with brace ranges \
             ({000..099}) for many"
                .into(),
        ));
    }
    let directory = key[..first].rsplit_once('/').map_or("", |(d, _)| d);
    let glob = glob::Pattern::new(key).map_err(|e| bad(format!("not a glob pattern: {e}")))?;
    let listed = if directory.is_empty() {
        format!("{scheme}://{bucket}")
    } else {
        format!("{scheme}://{bucket}/{directory}")
    };
    Ok(Some((listed, glob)))
}

/// One HEAD of each of `urls`, [`HEADS`] at a time, in order.
async fn heads(urls: Vec<ObjectUrl>, options: &StorageOptions) -> Result<Vec<Object>, RemoteError> {
    let mut requests = Vec::with_capacity(urls.len());
    for url in urls {
        let store = client(&url, options)?;
        requests.push(async move { Object::head(&*store, url).await });
    }
    futures_util::stream::iter(requests)
        .buffered(HEADS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pattern: &str) -> Option<(String, String)> {
        glob_of(pattern)
            .unwrap()
            .map(|(d, g)| (d, g.as_str().to_owned()))
    }

    #[test]
    fn the_directory_listed_is_the_one_before_the_first_glob_character() {
        assert_eq!(split("s3://b/train/x.tar"), None);
        assert_eq!(split("/local/*.tar"), None);
        assert_eq!(
            split("s3://b/train/shard-*.tar"),
            Some(("s3://b/train".into(), "train/shard-*.tar".into()))
        );
        assert_eq!(
            split("gs://b/*/x-?.tar"),
            Some(("gs://b".into(), "*/x-?.tar".into()))
        );
        assert_eq!(
            split("az://c/a/b[0-3]/y.parquet"),
            Some(("az://c/a".into(), "a/b[0-3]/y.parquet".into()))
        );
    }

    #[test]
    fn globs_stay_within_a_segment() {
        let (_, g) = glob_of("s3://b/train/*.tar").unwrap().unwrap();
        assert!(g.matches_with("train/a.tar", MATCH));
        assert!(!g.matches_with("train/old/a.tar", MATCH));
        assert!(!g.matches_with("train/a.TAR", MATCH));
        let (_, g) = glob_of("s3://b/t/[!ab]?.tar").unwrap().unwrap();
        assert!(g.matches_with("t/c1.tar", MATCH));
        assert!(!g.matches_with("t/a1.tar", MATCH));
        assert!(!g.matches_with("t/c/.tar", MATCH));
    }

    #[test]
    fn what_cannot_be_listed_is_refused_naming_the_pattern() {
        for (pattern, why) in [
            ("http://host/data/*.tar", "cannot be listed"),
            ("s3://b/a[.tar", "not a glob pattern"),
            ("ftp://host/*.tar", "not a URL of object storage"),
        ] {
            let e = glob_of(pattern).unwrap_err();
            assert!(matches!(e, RemoteError::BadUrl { .. }), "{e}");
            assert!(e.to_string().starts_with(pattern), "{e}");
            assert!(e.to_string().contains(why), "{e}");
        }
    }
}
