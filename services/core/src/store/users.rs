//! Users and API tokens; tokens are stored as the SHA-256 of their secret.

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, Condition, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder};

use super::entities::{api_token, job, user};
use super::{Store, StoreResult};
use crate::auth::{IssuedToken, Principal, Scope, TokenVerifier, constant_time_eq, hash_secret, issue_token};
use crate::authz::{Role, Roles};
use crate::ids::{new_id, now_ms};

/// How often a token's last use is written at most: a busy token costs one write a minute.
const LAST_USE_RESOLUTION_MS: i64 = 60_000;

/// What a new user token carries beside its user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenGrant {
    pub name: String,
    pub expires_at_ms: Option<i64>,
    /// The project and role the token is narrowed to.
    pub narrowed_to: Option<(String, Role)>,
}

impl Store {
    /// Creates the first user, `admin`, with a token, when there is no user yet. Returns the
    /// token's text only when it was created now; it is never stored in clear.
    pub async fn bootstrap_admin(&self) -> StoreResult<Option<IssuedToken>> {
        if user::Entity::find().count(&self.db).await? > 0 {
            return Ok(None);
        }
        let admin = self.create_user("admin", true).await?;
        let grant = TokenGrant {
            name: "bootstrap".into(),
            ..TokenGrant::default()
        };
        Ok(Some(self.issue_user_token(&admin.id, &grant).await?))
    }

    pub async fn create_user(&self, name: &str, is_admin: bool) -> StoreResult<user::Model> {
        let model = user::ActiveModel {
            id: Set(new_id()),
            name: Set(name.to_string()),
            is_admin: Set(is_admin),
            created_at_ms: Set(now_ms()),
            disabled: Set(false),
        };
        let id = model.id.clone().unwrap();
        user::Entity::insert(model).exec_without_returning(&self.db).await?;
        Ok(user::Entity::find_by_id(id)
            .one(&self.db)
            .await?
            .expect("user just inserted"))
    }

    pub async fn list_users(&self) -> StoreResult<Vec<user::Model>> {
        Ok(user::Entity::find()
            .order_by_asc(user::Column::Name)
            .all(&self.db)
            .await?)
    }

    pub async fn user_by_name(&self, name: &str) -> StoreResult<Option<user::Model>> {
        Ok(user::Entity::find()
            .filter(user::Column::Name.eq(name))
            .one(&self.db)
            .await?)
    }

    pub async fn user_by_id(&self, id: &str) -> StoreResult<Option<user::Model>> {
        Ok(user::Entity::find_by_id(id.to_string()).one(&self.db).await?)
    }

    /// Disables a user and revokes their user tokens; their jobs' tokens end with the jobs.
    pub async fn disable_user(&self, user_id: &str) -> StoreResult<()> {
        user::Entity::update_many()
            .col_expr(user::Column::Disabled, Expr::value(true))
            .filter(user::Column::Id.eq(user_id))
            .exec(&self.db)
            .await?;
        api_token::Entity::update_many()
            .col_expr(api_token::Column::Revoked, Expr::value(true))
            .filter(api_token::Column::UserId.eq(user_id))
            .filter(api_token::Column::Scope.eq(Scope::User.as_db()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Issues a token for a job (or another scope) of a user; the text is the only copy.
    pub async fn create_token(&self, user_id: &str, name: &str, scope: Scope) -> StoreResult<IssuedToken> {
        self.insert_token(user_id, name, scope, None, None).await
    }

    /// Issues a user's token as `grant` says; the returned text is the only copy of the secret.
    pub async fn issue_user_token(&self, user_id: &str, grant: &TokenGrant) -> StoreResult<IssuedToken> {
        self.insert_token(
            user_id,
            &grant.name,
            Scope::User,
            grant.expires_at_ms,
            grant.narrowed_to.clone(),
        )
        .await
    }

    pub(super) async fn insert_token(
        &self,
        user_id: &str,
        name: &str,
        scope: Scope,
        expires_at_ms: Option<i64>,
        narrowed_to: Option<(String, Role)>,
    ) -> StoreResult<IssuedToken> {
        let issued = issue_token();
        let (project, role) = narrowed_to
            .map(|(project, role)| (project, role.as_str().to_string()))
            .unwrap_or_default();
        api_token::Entity::insert(api_token::ActiveModel {
            id: Set(issued.id.clone()),
            user_id: Set(user_id.to_string()),
            secret_sha256: Set(issued.secret_sha256.clone()),
            name: Set(name.to_string()),
            scope: Set(scope.as_db()),
            revoked: Set(false),
            created_at_ms: Set(now_ms()),
            expires_at_ms: Set(expires_at_ms),
            last_used_at_ms: Set(None),
            project: Set(project),
            role: Set(role),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(issued)
    }

    /// A user's own tokens (not their jobs'), newest first; `all` adds revoked and expired ones.
    pub async fn list_tokens(&self, user_id: &str, all: bool) -> StoreResult<Vec<api_token::Model>> {
        let mut query = api_token::Entity::find()
            .filter(api_token::Column::UserId.eq(user_id))
            .filter(api_token::Column::Scope.eq(Scope::User.as_db()));
        if !all {
            query = query.filter(live_tokens(now_ms()));
        }
        Ok(query
            .order_by_desc(api_token::Column::CreatedAtMs)
            .all(&self.db)
            .await?)
    }

    /// A live user token of `user_id` by name, or any user token by id.
    pub async fn find_token(&self, user_id: Option<&str>, name_or_id: &str) -> StoreResult<Option<api_token::Model>> {
        let mut by = Condition::any().add(api_token::Column::Id.eq(name_or_id));
        if user_id.is_some() {
            by = by.add(
                Condition::all()
                    .add(api_token::Column::Name.eq(name_or_id))
                    .add(live_tokens(now_ms())),
            );
        }
        let mut query = api_token::Entity::find()
            .filter(by)
            .filter(api_token::Column::Scope.eq(Scope::User.as_db()));
        if let Some(user_id) = user_id {
            query = query.filter(api_token::Column::UserId.eq(user_id));
        }
        Ok(query.one(&self.db).await?)
    }

    pub async fn revoke_token(&self, token_id: &str) -> StoreResult<()> {
        api_token::Entity::update_many()
            .col_expr(api_token::Column::Revoked, Expr::value(true))
            .filter(api_token::Column::Id.eq(token_id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Revokes every token of a scope (a job's tokens when it ends).
    pub async fn revoke_tokens(&self, scope: &Scope) -> StoreResult<()> {
        api_token::Entity::update_many()
            .col_expr(api_token::Column::Revoked, Expr::value(true))
            .filter(api_token::Column::Scope.eq(scope.as_db()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Looks a token up; `None` when unknown, revoked, expired, not matching, or its user is
    /// disabled (a disabled user's job tokens live on until their jobs end).
    pub async fn verify_token(&self, token_id: &str, secret: &str) -> StoreResult<Option<Principal>> {
        let Some(token) = api_token::Entity::find_by_id(token_id.to_string())
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        let now = now_ms();
        let expired = token.expires_at_ms.is_some_and(|at| at <= now);
        if token.revoked || expired || !constant_time_eq(&hash_secret(secret), &token.secret_sha256) {
            return Ok(None);
        }
        let Some(user) = user::Entity::find_by_id(token.user_id.clone()).one(&self.db).await? else {
            return Ok(None);
        };
        let scope = Scope::from_db(&token.scope);
        if (user.disabled && scope == Scope::User) || scope == Scope::Login {
            return Ok(None);
        }
        self.note_token_use(&token, now).await?;
        let narrowed = Role::parse(&token.role).filter(|_| !token.project.is_empty());
        let (roles, job_batch_id) = match &scope {
            Scope::Job(job_id) => (Roles::new(), self.batch_of_job(job_id).await?),
            Scope::User | Scope::Login => {
                let mut roles = if user.is_admin {
                    Roles::new()
                } else {
                    self.memberships(&user.id).await?
                };
                if let Some(cap) = narrowed {
                    let base = if user.is_admin {
                        Some(Role::Maintainer)
                    } else {
                        roles.get(&token.project).copied()
                    };
                    roles = base
                        .map(|base| Roles::from([(token.project.clone(), base.min(cap))]))
                        .unwrap_or_default();
                }
                (roles, None)
            }
        };
        Ok(Some(Principal {
            user_id: user.id,
            user_name: user.name,
            is_admin: user.is_admin && narrowed.is_none() && scope == Scope::User,
            scope,
            token_id: token.id,
            token_name: token.name,
            roles,
            job_batch_id,
        }))
    }

    /// Records when a token was last used, at most once per [`LAST_USE_RESOLUTION_MS`].
    async fn note_token_use(&self, token: &api_token::Model, now: i64) -> StoreResult<()> {
        if token
            .last_used_at_ms
            .is_some_and(|at| now - at < LAST_USE_RESOLUTION_MS)
        {
            return Ok(());
        }
        api_token::Entity::update_many()
            .col_expr(api_token::Column::LastUsedAtMs, Expr::value(now))
            .filter(api_token::Column::Id.eq(token.id.clone()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    async fn batch_of_job(&self, job_id: &str) -> StoreResult<Option<String>> {
        let record = job::Entity::find_by_id(job_id.to_string()).one(&self.db).await?;
        Ok(record.map(|job| job.batch_id).filter(|batch| !batch.is_empty()))
    }
}

/// Tokens neither revoked nor expired at `now`.
fn live_tokens(now: i64) -> Condition {
    Condition::all().add(api_token::Column::Revoked.eq(false)).add(
        Condition::any()
            .add(api_token::Column::ExpiresAtMs.is_null())
            .add(api_token::Column::ExpiresAtMs.gt(now)),
    )
}

#[async_trait::async_trait]
impl TokenVerifier for Store {
    async fn verify(&self, token_id: &str, secret: &str) -> Result<Option<Principal>, String> {
        self.verify_token(token_id, secret).await.map_err(|e| e.to_string())
    }
}
