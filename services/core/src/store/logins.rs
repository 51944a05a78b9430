//! The web UI's logins through the CLI (`kiln ui`): asked for by the browser, approved from the
//! CLI, redeemed by the browser that asked — a device authorization (RFC 8628) turned round.
//!
//! 1. The browser asks for a pending login ([`Store::begin_login`]) and gets a nonce, which the
//!    api keeps in an HttpOnly, SameSite=Strict cookie, and a short code its page shows. The
//!    store keeps only their SHA-256.
//! 2. A signed-in user approves the code from the CLI ([`Store::approve_login`],
//!    `UserService.ApproveLogin`): the login is bound to them, narrowed as their token is.
//! 3. The browser redeems it with its nonce ([`Store::redeem_login`]) and gets a session token.
//!
//! So only the browser that asked is signed in: a link or a code passed to another browser signs
//! nothing in (that browser has no nonce), and no one can sign someone else's browser in to their
//! own account unless that browser shows them its code. Each step is a compare-and-set on the
//! row's state (`pending → approved → redeemed`), so a login is approved once and redeemed once.
//! A code approved by a second user is disputed: the login is cancelled, and the session it
//! made, if any, revoked. Wrong codes are counted per approving user ([`MAX_WRONG_CODES`] in
//! [`WRONG_CODE_WINDOW_MS`]), so a live code cannot be found by trying.

use rand::Rng;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, Set};

use super::entities::{api_token, login_approval_failure, pending_login};
use super::users::TokenGrant;
use super::{Store, StoreResult};
use crate::ErrorKind;
use crate::auth::{IssuedToken, Principal, constant_time_eq, hash_secret, issue_token, parse_token};
use crate::authz::Role;
use crate::ids::now_ms;

/// How long a browser's pending login lives, from its asking to its redemption.
pub const PENDING_LOGIN_TTL_MS: i64 = 5 * 60_000;

/// How many wrong codes a user may approve in [`WRONG_CODE_WINDOW_MS`]; then every approval of
/// theirs is refused until the window ends.
pub const MAX_WRONG_CODES: i32 = 5;

/// The window over which wrong codes are counted.
pub const WRONG_CODE_WINDOW_MS: i64 = 15 * 60_000;

/// How many logins may wait for approval at once (anyone may ask for one, signed in or not).
pub const MAX_WAITING_LOGINS: u64 = 10_000;

/// How long an expired login is kept, to say "expired" rather than "unknown".
const EXPIRED_KEPT_MS: i64 = 60 * 60_000;

/// The name a session token made by a login starts with (logging out revokes these).
pub const SESSION_TOKEN_PREFIX: &str = "ui-session-";

/// The letters of a code: consonants only (no vowels, so no words), none that looks like a
/// digit. 20^8 codes, about 34 bits (RFC 8628 §6.1).
const CODE_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";
const CODE_LEN: usize = 8;

const PENDING: &str = "pending";
const APPROVED: &str = "approved";
const REDEEMED: &str = "redeemed";
const DISPUTED: &str = "disputed";

/// Why a login step is refused; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("{code:?} is not a login code: the browser's login page shows one of 8 letters, like BCDF-GHJK")]
    MalformedCode { code: String },
    #[error(
        "no login is waiting for code {code}: check the code the browser shows, or reload its login page for a new one"
    )]
    UnknownCode { code: String },
    #[error("too many wrong login codes: approve again in {retry_in_secs} s")]
    TooManyWrongCodes { retry_in_secs: i64 },
    #[error("the login with code {code} expired: reload the browser's login page for a new code")]
    CodeExpired { code: String },
    #[error("code {code} is approved already: the browser signs in by itself")]
    AlreadyApproved { code: String },
    #[error(
        "code {code} was approved by another user, so that login is cancelled (and its session revoked): reload the browser's login page and approve its new code"
    )]
    ApprovedByAnother { code: String },
    #[error(
        "this browser has no login waiting (it did not ask for one here, or its cookie expired): open the login page in this browser and approve the code it shows with `kiln ui`"
    )]
    NotThisBrowser,
    #[error("this login expired before it was approved and used: reload the login page for a new code")]
    Expired,
    #[error("this login was used already: reload the login page to sign in again")]
    Used,
    #[error("two users approved this login's code, so it is cancelled: reload the login page for a new code")]
    Disputed,
    #[error("too many logins are waiting for approval: retry in a few minutes, or sign in with a token")]
    TooManyWaiting,
}

impl LoginError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            LoginError::MalformedCode { .. } => ErrorKind::InvalidArgument,
            LoginError::UnknownCode { .. } => ErrorKind::NotFound,
            LoginError::TooManyWrongCodes { .. } | LoginError::TooManyWaiting => ErrorKind::ResourceExhausted,
            LoginError::CodeExpired { .. }
            | LoginError::AlreadyApproved { .. }
            | LoginError::Expired
            | LoginError::Used => ErrorKind::FailedPrecondition,
            LoginError::ApprovedByAnother { .. } | LoginError::Disputed => ErrorKind::PermissionDenied,
            LoginError::NotThisBrowser => ErrorKind::Unauthenticated,
        }
    }
}

/// A login a browser asked for: what the api hands that browser, once.
#[derive(Debug, Clone)]
pub struct PendingLogin {
    /// The browser's proof (`kiln_<id>_<secret>`), for its cookie only.
    pub nonce: String,
    /// The code its page shows, as `BCDF-GHJK`.
    pub code: String,
    pub expires_at_ms: i64,
}

/// The login an approval bound to its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovedLogin {
    pub user_agent: String,
    pub requested_at_ms: i64,
    pub expires_at_ms: i64,
}

/// What a browser's redemption gets.
#[derive(Clone)]
pub enum Redemption {
    /// Not approved yet: ask again (until `expires_at_ms`).
    Waiting { expires_at_ms: i64 },
    /// Approved: the session token of the approving user.
    SignedIn(IssuedToken),
}

impl Store {
    /// Records a login the browser with `user_agent` asks for.
    pub async fn begin_login(&self, user_agent: &str) -> StoreResult<PendingLogin> {
        let now = now_ms();
        pending_login::Entity::delete_many()
            .filter(pending_login::Column::ExpiresAtMs.lt(now - EXPIRED_KEPT_MS))
            .exec(&self.db)
            .await?;
        let waiting = pending_login::Entity::find()
            .filter(pending_login::Column::State.eq(PENDING))
            .filter(pending_login::Column::ExpiresAtMs.gt(now))
            .count(&self.db)
            .await?;
        if waiting >= MAX_WAITING_LOGINS {
            return Err(LoginError::TooManyWaiting.into());
        }
        let nonce = issue_token();
        let code = new_code();
        let expires_at_ms = now + PENDING_LOGIN_TTL_MS;
        pending_login::Entity::insert(pending_login::ActiveModel {
            id: Set(nonce.id.clone()),
            nonce_sha256: Set(nonce.secret_sha256.clone()),
            code_sha256: Set(hash_secret(&code)),
            state: Set(PENDING.into()),
            user_agent: Set(user_agent.chars().take(256).collect()),
            created_at_ms: Set(now),
            expires_at_ms: Set(expires_at_ms),
            user_id: Set(String::new()),
            project: Set(String::new()),
            role: Set(String::new()),
            session_token_id: Set(String::new()),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(PendingLogin {
            nonce: nonce.token,
            code: shown(&code),
            expires_at_ms,
        })
    }

    /// Binds the login waiting for `code` to `caller`, narrowed as the caller's token is.
    pub async fn approve_login(&self, caller: &Principal, code: &str) -> StoreResult<ApprovedLogin> {
        let Some(code) = normalized(code) else {
            return Err(LoginError::MalformedCode {
                code: code.chars().take(20).collect(),
            }
            .into());
        };
        let now = now_ms();
        self.check_wrong_codes(&caller.user_id, now).await?;
        let shown_code = shown(&code);
        // A step a racing call took first is answered as the row then stands: states only move
        // forward, so this ends.
        loop {
            let newest = pending_login::Entity::find()
                .filter(pending_login::Column::CodeSha256.eq(hash_secret(&code)))
                .order_by_desc(pending_login::Column::CreatedAtMs)
                .one(&self.db)
                .await?;
            let Some(login) = newest else {
                self.note_wrong_code(&caller.user_id, now).await?;
                return Err(LoginError::UnknownCode { code: shown_code }.into());
            };
            if login.expires_at_ms <= now {
                return Err(LoginError::CodeExpired { code: shown_code }.into());
            }
            match login.state.as_str() {
                PENDING => {
                    let (project, role) = self
                        .narrowing_of(&caller.token_id)
                        .await?
                        .map(|(project, role)| (project, role.as_str().to_string()))
                        .unwrap_or_default();
                    let approved = pending_login::Entity::update_many()
                        .col_expr(pending_login::Column::State, Expr::value(APPROVED))
                        .col_expr(pending_login::Column::UserId, Expr::value(caller.user_id.clone()))
                        .col_expr(pending_login::Column::Project, Expr::value(project))
                        .col_expr(pending_login::Column::Role, Expr::value(role))
                        .filter(pending_login::Column::Id.eq(&login.id))
                        .filter(pending_login::Column::State.eq(PENDING))
                        .exec(&self.db)
                        .await?;
                    if approved.rows_affected == 1 {
                        return Ok(ApprovedLogin {
                            user_agent: login.user_agent,
                            requested_at_ms: login.created_at_ms,
                            expires_at_ms: login.expires_at_ms,
                        });
                    }
                }
                APPROVED | REDEEMED if login.user_id == caller.user_id => {
                    return Err(LoginError::AlreadyApproved { code: shown_code }.into());
                }
                _ => {
                    self.dispute(&login.id).await?;
                    return Err(LoginError::ApprovedByAnother { code: shown_code }.into());
                }
            }
        }
    }

    /// Redeems the login whose nonce a browser holds: its session once approved, valid for
    /// `session_ms`.
    pub async fn redeem_login(&self, nonce: &str, session_ms: i64) -> StoreResult<Redemption> {
        let login = self.login_of_nonce(nonce).await?;
        let now = now_ms();
        match login.state.as_str() {
            REDEEMED => return Err(LoginError::Used.into()),
            DISPUTED => return Err(LoginError::Disputed.into()),
            _ if login.expires_at_ms <= now => return Err(LoginError::Expired.into()),
            PENDING => {
                return Ok(Redemption::Waiting {
                    expires_at_ms: login.expires_at_ms,
                });
            }
            _ => {}
        }
        let grant = TokenGrant {
            name: format!("{SESSION_TOKEN_PREFIX}{now}-{}", &login.id[..login.id.len().min(8)]),
            expires_at_ms: Some(now + session_ms),
            narrowed_to: Role::parse(&login.role)
                .filter(|_| !login.project.is_empty())
                .map(|role| (login.project.clone(), role)),
        };
        // The token exists before the row says so, so a dispute always finds what to revoke.
        let session = self.issue_user_token(&login.user_id, &grant).await?;
        let redeemed = pending_login::Entity::update_many()
            .col_expr(pending_login::Column::State, Expr::value(REDEEMED))
            .col_expr(pending_login::Column::SessionTokenId, Expr::value(session.id.clone()))
            .filter(pending_login::Column::Id.eq(&login.id))
            .filter(pending_login::Column::State.eq(APPROVED))
            .exec(&self.db)
            .await?;
        if redeemed.rows_affected == 1 {
            return Ok(Redemption::SignedIn(session));
        }
        // A racing redemption or dispute came first.
        self.revoke_token(&session.id).await?;
        match self.login_of_nonce(nonce).await?.state.as_str() {
            DISPUTED => Err(LoginError::Disputed.into()),
            _ => Err(LoginError::Used.into()),
        }
    }

    /// The login a browser's nonce proves, whatever its state.
    async fn login_of_nonce(&self, nonce: &str) -> StoreResult<pending_login::Model> {
        let Some((id, secret)) = parse_token(nonce) else {
            return Err(LoginError::NotThisBrowser.into());
        };
        let login = pending_login::Entity::find_by_id(id.to_string()).one(&self.db).await?;
        login
            .filter(|login| constant_time_eq(&hash_secret(secret), &login.nonce_sha256))
            .ok_or_else(|| LoginError::NotThisBrowser.into())
    }

    /// Cancels an approved or redeemed login (a second user approved its code), revoking the
    /// session it made.
    async fn dispute(&self, login_id: &str) -> StoreResult<()> {
        loop {
            let Some(login) = pending_login::Entity::find_by_id(login_id.to_string())
                .one(&self.db)
                .await?
            else {
                return Ok(());
            };
            if login.state == DISPUTED {
                return Ok(());
            }
            let disputed = pending_login::Entity::update_many()
                .col_expr(pending_login::Column::State, Expr::value(DISPUTED))
                .filter(pending_login::Column::Id.eq(login_id))
                .filter(pending_login::Column::State.eq(&login.state))
                .exec(&self.db)
                .await?;
            if disputed.rows_affected == 1 {
                if !login.session_token_id.is_empty() {
                    self.revoke_token(&login.session_token_id).await?;
                }
                tracing::warn!(login = %login_id, "a login code was approved by two users: the login is cancelled");
                return Ok(());
            }
        }
    }

    /// Refuses every approval of a user who approved too many wrong codes lately.
    async fn check_wrong_codes(&self, user_id: &str, now: i64) -> StoreResult<()> {
        let counted = login_approval_failure::Entity::find_by_id(user_id.to_string())
            .one(&self.db)
            .await?;
        match counted {
            Some(counted)
                if counted.window_started_at_ms > now - WRONG_CODE_WINDOW_MS && counted.failures >= MAX_WRONG_CODES =>
            {
                let window_ends = counted.window_started_at_ms + WRONG_CODE_WINDOW_MS;
                Err(LoginError::TooManyWrongCodes {
                    retry_in_secs: (window_ends - now + 999) / 1000,
                }
                .into())
            }
            _ => Ok(()),
        }
    }

    /// Counts a wrong code against a user, in the current window or a new one.
    async fn note_wrong_code(&self, user_id: &str, now: i64) -> StoreResult<()> {
        let counted = login_approval_failure::Entity::update_many()
            .col_expr(
                login_approval_failure::Column::Failures,
                Expr::col(login_approval_failure::Column::Failures).add(1),
            )
            .filter(login_approval_failure::Column::UserId.eq(user_id))
            .filter(login_approval_failure::Column::WindowStartedAtMs.gt(now - WRONG_CODE_WINDOW_MS))
            .exec(&self.db)
            .await?;
        if counted.rows_affected == 1 {
            return Ok(());
        }
        login_approval_failure::Entity::insert(login_approval_failure::ActiveModel {
            user_id: Set(user_id.to_string()),
            window_started_at_ms: Set(now),
            failures: Set(1),
        })
        .on_conflict(
            OnConflict::column(login_approval_failure::Column::UserId)
                .update_columns([
                    login_approval_failure::Column::WindowStartedAtMs,
                    login_approval_failure::Column::Failures,
                ])
                .to_owned(),
        )
        .exec_without_returning(&self.db)
        .await?;
        Ok(())
    }

    /// The project and role a token is narrowed to, if it is.
    async fn narrowing_of(&self, token_id: &str) -> StoreResult<Option<(String, Role)>> {
        let token = api_token::Entity::find_by_id(token_id.to_string())
            .one(&self.db)
            .await?;
        Ok(token.and_then(|token| {
            Role::parse(&token.role)
                .filter(|_| !token.project.is_empty())
                .map(|role| (token.project, role))
        }))
    }
}

/// A fresh code, normalised (`BCDFGHJK`).
fn new_code() -> String {
    let mut rng = rand::rng();
    (0..CODE_LEN)
        .map(|_| char::from(CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())]))
        .collect()
}

/// A code as typed (any case, spaces and dashes), normalised; `None` when it cannot be one.
fn normalized(typed: &str) -> Option<String> {
    let code: String = typed
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    let well_formed = code.len() == CODE_LEN && code.bytes().all(|b| CODE_ALPHABET.contains(&b));
    well_formed.then_some(code)
}

/// A normalised code as a page shows it: `BCDF-GHJK`.
fn shown(code: &str) -> String {
    format!("{}-{}", &code[..CODE_LEN / 2], &code[CODE_LEN / 2..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_read_as_people_type_them() {
        let code = new_code();
        assert_eq!(code.len(), CODE_LEN);
        assert_eq!(normalized(&shown(&code)).as_deref(), Some(code.as_str()));
        assert_eq!(normalized(" bcdf-ghjk\n").as_deref(), Some("BCDFGHJK"));
        assert_eq!(normalized("bc df gh jk").as_deref(), Some("BCDFGHJK"));
        for wrong in ["", "BCDF-GHJ", "BCDF-GHJKL", "ABCD-EFGH", "BCDF-GHJ1", "ВCDF-GHJK"] {
            assert_eq!(normalized(wrong), None, "{wrong}");
        }
        assert_eq!(shown("BCDFGHJK"), "BCDF-GHJK");
    }
}
