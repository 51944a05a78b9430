//! The web UI's logins, in the store's conformance suite (store.rs runs it on SQLite and
//! Postgres): a login the browser asked for is redeemed only with that browser's nonce, once,
//! after a user approved its code; a code approved by a second user cancels the login; wrong
//! codes run out, and expired logins are refused.

use kiln_core::auth::{Principal, parse_token};
use kiln_core::authz::Role;
use kiln_core::store::TokenGrant;
use kiln_core::store::entities::pending_login;
use kiln_core::store::logins::{LoginError, MAX_WRONG_CODES, Redemption, SESSION_TOKEN_PREFIX};
use sea_orm::EntityTrait;
use sea_orm::sea_query::Expr;

use super::*;

/// The principal of a new token of `user_name` (made an enabled user first).
async fn principal(store: &Store, user_name: &str, narrowed_to: Option<(String, Role)>) -> Principal {
    let user = match store.user_by_name(user_name).await.unwrap() {
        Some(user) => user,
        None => store.create_user(user_name, false).await.unwrap(),
    };
    let grant = TokenGrant {
        name: format!("cli-{}", kiln_core::ids::new_id()),
        expires_at_ms: None,
        narrowed_to,
    };
    let issued = store.issue_user_token(&user.id, &grant).await.unwrap();
    let (id, secret) = parse_token(&issued.token).unwrap();
    store.verify_token(id, secret).await.unwrap().unwrap()
}

fn login_error(error: StoreError) -> LoginError {
    match error {
        StoreError::Login(error) => error,
        other => panic!("not a login refusal: {other:?}"),
    }
}

async fn redeem(store: &Store, nonce: &str) -> Result<Redemption, LoginError> {
    store.redeem_login(nonce, 60_000).await.map_err(login_error)
}

async fn session_of(store: &Store, redemption: Redemption) -> Option<Principal> {
    let Redemption::SignedIn(session) = redemption else {
        panic!("not signed in");
    };
    let (id, secret) = parse_token(&session.token).unwrap();
    store.verify_token(id, secret).await.unwrap()
}

pub(super) async fn a_login_is_redeemed_once_and_only_by_the_browser_that_asked(store: Store) {
    let ada = principal(&store, "ada", None).await;
    let asked = store.begin_login("Firefox/140").await.unwrap();
    let elsewhere = store.begin_login("Chromium/139").await.unwrap();
    assert_ne!(asked.code, elsewhere.code);
    assert!(matches!(
        redeem(&store, &asked.nonce).await,
        Ok(Redemption::Waiting { .. })
    ));

    // The code, typed as a person types it, binds the login to ada and names the browser.
    let approved = store
        .approve_login(&ada, &format!(" {} ", asked.code.to_lowercase().replace('-', " ")))
        .await
        .unwrap();
    assert_eq!(
        (approved.user_agent.as_str(), approved.expires_at_ms),
        ("Firefox/140", asked.expires_at_ms)
    );

    // Another browser signs nothing in: not with its own nonce, none, or a forged one.
    assert!(matches!(
        redeem(&store, &elsewhere.nonce).await,
        Ok(Redemption::Waiting { .. })
    ));
    let (id, _) = parse_token(&asked.nonce).unwrap();
    for forged in [
        String::new(),
        format!("kiln_{id}_{}", "0".repeat(64)),
        asked.code.clone(),
    ] {
        assert!(
            matches!(redeem(&store, &forged).await, Err(LoginError::NotThisBrowser)),
            "{forged}"
        );
    }

    // The browser that asked redeems it, once, however many times it races.
    let raced = futures::future::join_all((0..8).map(|_| redeem(&store, &asked.nonce))).await;
    let mut sessions = Vec::new();
    for redeemed in raced {
        match redeemed {
            Ok(redemption @ Redemption::SignedIn(_)) => sessions.push(redemption),
            Err(LoginError::Used) => {}
            other => panic!("neither a session nor used: {:?}", other.err()),
        }
    }
    assert_eq!(sessions.len(), 1, "a login signs in once");
    let session = session_of(&store, sessions.remove(0)).await.unwrap();
    assert_eq!(session.user_name, "ada");
    assert!(
        session.token_name.starts_with(SESSION_TOKEN_PREFIX),
        "{}",
        session.token_name
    );

    // Replays are refused, each with its own words.
    assert!(matches!(redeem(&store, &asked.nonce).await, Err(LoginError::Used)));
    assert!(matches!(
        store.approve_login(&ada, &asked.code).await.map_err(login_error),
        Err(LoginError::AlreadyApproved { .. })
    ));

    // The nonce is no bearer token, and neither it nor the code is stored.
    let (nonce_id, nonce_secret) = parse_token(&asked.nonce).unwrap();
    assert!(store.verify_token(nonce_id, nonce_secret).await.unwrap().is_none());
    let row = pending_login::Entity::find_by_id(nonce_id.to_string())
        .one(store.connection())
        .await
        .unwrap()
        .unwrap();
    assert!(!format!("{row:?}").contains(nonce_secret) && !format!("{row:?}").contains(&asked.code.replace('-', "")));

    // A narrowed token's approval makes a session narrowed the same way.
    store.create_project("vision").await.unwrap();
    store
        .set_member("vision", &ada.user_id, Role::Maintainer)
        .await
        .unwrap();
    let narrowed = principal(&store, "ada", Some(("vision".into(), Role::Viewer))).await;
    let asked = store.begin_login("").await.unwrap();
    store.approve_login(&narrowed, &asked.code).await.unwrap();
    let session = session_of(&store, redeem(&store, &asked.nonce).await.unwrap())
        .await
        .unwrap();
    assert_eq!(session.roles.get("vision"), Some(&Role::Viewer));
}

pub(super) async fn a_code_approved_by_another_user_cancels_the_login(store: Store) {
    let ada = principal(&store, "ada", None).await;
    let eve = principal(&store, "eve", None).await;

    // Approved by ada and redeemed, then approved by eve: ada's session is revoked.
    let asked = store.begin_login("Firefox/140").await.unwrap();
    store.approve_login(&ada, &asked.code).await.unwrap();
    let signed_in = redeem(&store, &asked.nonce).await.unwrap();
    let Redemption::SignedIn(session) = signed_in.clone() else {
        panic!("not signed in")
    };
    assert!(session_of(&store, signed_in.clone()).await.is_some());
    assert!(matches!(
        store.approve_login(&eve, &asked.code).await.map_err(login_error),
        Err(LoginError::ApprovedByAnother { .. })
    ));
    assert!(
        session_of(&store, signed_in).await.is_none(),
        "the disputed session {} lives",
        session.id
    );
    assert!(matches!(redeem(&store, &asked.nonce).await, Err(LoginError::Disputed)));

    // Approved by eve first (she guessed it): ada's own approval cancels it before it is used.
    let asked = store.begin_login("Firefox/140").await.unwrap();
    store.approve_login(&eve, &asked.code).await.unwrap();
    let refused = store.approve_login(&ada, &asked.code).await.map_err(login_error);
    assert!(matches!(refused, Err(LoginError::ApprovedByAnother { .. })));
    assert!(matches!(redeem(&store, &asked.nonce).await, Err(LoginError::Disputed)));
}

pub(super) async fn wrong_codes_run_out_and_expired_logins_are_refused(store: Store) {
    let mallory = principal(&store, "mallory", None).await;
    let ada = principal(&store, "ada", None).await;
    let asked = store.begin_login("Firefox/140").await.unwrap();
    let malformed = store.approve_login(&mallory, "ABCD-EFGH").await.map_err(login_error);
    assert!(
        matches!(malformed, Err(LoginError::MalformedCode { .. })),
        "vowels are never in a code"
    );
    // Guessing: every wrong code counts, then even a right one is refused.
    let mut wrong = 0;
    for guess in [
        "BBBB-BBBB",
        "CCCC-CCCC",
        "DDDD-DDDD",
        "FFFF-FFFF",
        "GGGG-GGGG",
        "HHHH-HHHH",
    ] {
        if guess == asked.code {
            continue;
        }
        let refused = store.approve_login(&mallory, guess).await.map_err(login_error);
        assert!(matches!(refused, Err(LoginError::UnknownCode { .. })), "{refused:?}");
        wrong += 1;
        if wrong == MAX_WRONG_CODES {
            break;
        }
    }
    let refused = store.approve_login(&mallory, &asked.code).await.map_err(login_error);
    let Err(LoginError::TooManyWrongCodes { retry_in_secs }) = refused else {
        panic!("a guesser approved: {refused:?}");
    };
    assert!(retry_in_secs > 0);
    assert!(matches!(
        redeem(&store, &asked.nonce).await,
        Ok(Redemption::Waiting { .. })
    ));
    // Another user's approvals are not counted with mallory's.
    store.approve_login(&ada, &asked.code).await.unwrap();

    // Expired: neither approved nor redeemed.
    let late = store.begin_login("Firefox/140").await.unwrap();
    let approved_late = store.begin_login("Firefox/140").await.unwrap();
    store.approve_login(&ada, &approved_late.code).await.unwrap();
    pending_login::Entity::update_many()
        .col_expr(
            pending_login::Column::ExpiresAtMs,
            Expr::value(kiln_core::ids::now_ms() - 1),
        )
        .exec(store.connection())
        .await
        .unwrap();
    assert!(matches!(
        store.approve_login(&ada, &late.code).await.map_err(login_error),
        Err(LoginError::CodeExpired { .. })
    ));
    for nonce in [&late.nonce, &approved_late.nonce] {
        assert!(matches!(redeem(&store, nonce).await, Err(LoginError::Expired)));
    }
}
