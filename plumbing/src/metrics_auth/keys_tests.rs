//! When the issuer's keys are read: first when needed, again for a key not held at most once
//! per interval, and, while they can not be read, every token left to the apiserver as before.

use std::sync::atomic::Ordering;

use super::delegated_tests::{headers, unix_now, with_keys};
use super::jwks_tests::{Signer, forged};
use super::keys::{FETCH_EVERY, FRESH_FOR};
use super::*;

/// The keys are rotated on the apiserver: a token signed with the new key is refused until the
/// keys may be read again (a flood of unknown key ids costs one read per interval, whatever its
/// size), then judged by them and sent to the apiserver.
#[tokio::test(start_paused = true)]
async fn a_key_not_held_is_read_again_at_most_once_per_interval() {
    let (old, rotated) = (Signer::new("old"), Signer::new("rotated"));
    let (api, auth) = with_keys(&old);
    let token = rotated.token("system:serviceaccount:monitoring:prometheus", unix_now());
    api.accepted.lock().unwrap().push(token.clone());
    let unknown = auth.check(&headers(&token)).await.unwrap_err();
    assert_eq!(unknown.0, StatusCode::UNAUTHORIZED);
    assert_eq!(api.reads.load(Ordering::SeqCst), 1);

    // Published now; read again once the interval has passed, at the first key not held.
    api.keys
        .lock()
        .unwrap()
        .as_mut()
        .unwrap()
        .push(rotated.jwk());
    tokio::time::advance(FETCH_EVERY).await;
    for i in 0..1000 {
        let made_up = Signer::new(&format!("made-up-{i}"));
        let t = made_up.token("system:serviceaccount:x:y", unix_now());
        assert_eq!(
            auth.check(&headers(&t)).await.unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        if i == 0 {
            assert_eq!(api.reads.load(Ordering::SeqCst), 2, "read again");
        }
    }
    assert_eq!(api.reads.load(Ordering::SeqCst), 2, "one read per interval");
    assert_eq!(
        auth.check(&headers(&token)).await,
        Ok(()),
        "the new key held"
    );
    assert_eq!(api.reviews.load(Ordering::SeqCst), 1, "only its own");
    assert_eq!(auth.refused.with_label_values(&["unknown_key"]).get(), 1001);
}

/// Keys not served (404), not allowed (403), or an apiserver down: every token goes to the
/// apiserver on the budget of tokens never seen, as without the keys (a forged one too), and
/// the keys are tried again once per interval; once they are read, forgeries cost nothing.
#[tokio::test(start_paused = true)]
async fn without_the_keys_tokens_go_to_the_apiserver_as_before() {
    for code in [404u16, 403, 503] {
        let issuer = Signer::new("sa-key");
        let (api, auth) = with_keys(&issuer);
        let real = issuer.token("system:serviceaccount:monitoring:prometheus", unix_now());
        api.accepted.lock().unwrap().push(real.clone());
        if code == 404 {
            *api.keys.lock().unwrap() = None;
        }
        // Discovery only answers `code`; reviews are answered while the test lets them.
        let down = |on: bool| api.down.store(if on { code } else { 0 }, Ordering::SeqCst);
        down(code != 404);
        let _ = auth.check(&headers(&forged(&real))).await;
        down(false);
        let before = api.reviews.load(Ordering::SeqCst);
        for i in 0..3 {
            let r = auth
                .check(&headers(&forged(
                    &issuer.token(&format!("x{i}"), unix_now()),
                )))
                .await;
            assert_eq!(r.unwrap_err().0, StatusCode::UNAUTHORIZED, "{code}");
        }
        assert_eq!(
            api.reviews.load(Ordering::SeqCst),
            before + 3,
            "{code}: forgeries left to the apiserver"
        );
        assert_eq!(auth.check(&headers(&real)).await, Ok(()), "{code}");
        assert_eq!(api.reads.load(Ordering::SeqCst), 1, "{code}: tried once");

        // Served again: read at the next check past the interval.
        *api.keys.lock().unwrap() = Some(vec![issuer.jwk()]);
        tokio::time::advance(FETCH_EVERY).await;
        let reviews = api.reviews.load(Ordering::SeqCst);
        assert_eq!(
            auth.check(&headers(&forged(&real))).await.unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            api.reviews.load(Ordering::SeqCst),
            reviews,
            "{code}: refused here"
        );
        assert_eq!(
            auth.refused.with_label_values(&["bad_signature"]).get(),
            1,
            "{code}"
        );
    }
}

/// Keys held are read again after FRESH_FOR when next needed, so an issuer changed on the
/// apiserver is taken up; a read that fails keeps the keys held.
#[tokio::test(start_paused = true)]
async fn old_keys_are_read_again_and_kept_when_the_read_fails() {
    let issuer = Signer::new("sa-key");
    let (api, auth) = with_keys(&issuer);
    let check = |token: String| {
        let auth = auth.clone();
        async move { auth.check(&headers(&token)).await }
    };
    assert!(check(forged(&issuer.token("a", unix_now()))).await.is_err());
    assert_eq!(api.reads.load(Ordering::SeqCst), 1);
    tokio::time::advance(FRESH_FOR).await;
    api.down.store(503, Ordering::SeqCst);
    assert!(check(forged(&issuer.token("b", unix_now()))).await.is_err());
    assert_eq!(api.reads.load(Ordering::SeqCst), 2, "read again");
    assert_eq!(
        api.reviews.load(Ordering::SeqCst),
        0,
        "the keys held judged it"
    );
    api.down.store(0, Ordering::SeqCst);
    tokio::time::advance(FETCH_EVERY).await;
    assert!(check(forged(&issuer.token("c", unix_now()))).await.is_err());
    assert_eq!(api.reads.load(Ordering::SeqCst), 3);
    assert_eq!(auth.refused.with_label_values(&["bad_signature"]).get(), 3);
}
