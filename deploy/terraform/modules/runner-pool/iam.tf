# What a runner may do, and nothing else: read its two binaries of the release, the
# database secret and its NATS seed (SSM Parameter Store, SecureString); in kiln's prefix of the bucket, read code bundles and datasets (artifacts/),
# read, write and list jobs' outputs (outputs/). No delete, nothing outside the prefix.
locals {
  prefix = "${var.objects_prefix}/"
}

data "aws_iam_policy_document" "runner" {
  statement {
    sid     = "ReadRelease"
    actions = ["s3:GetObject"]
    resources = [
      "${var.bucket_arn}/${var.release_prefix}/kiln-runner",
      "${var.bucket_arn}/${var.release_prefix}/kiln-agent",
    ]
  }

  statement {
    sid       = "ReadDatabaseSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.database.secret_arn]
  }

  statement {
    sid       = "ReadNatsSeed"
    actions   = ["ssm:GetParameter"]
    resources = ["${var.nats_seed_arn_prefix}/runner"]
  }

  statement {
    sid     = "ReadArtifacts"
    actions = ["s3:GetObject"]
    resources = [
      "${var.bucket_arn}/${local.prefix}artifacts/*",
      # The object kiln HEADs at start to check it can reach the store (made by the root module).
      "${var.bucket_arn}/${local.prefix}kiln-connect-probe",
    ]
  }

  statement {
    sid       = "SyncOutputs"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    resources = ["${var.bucket_arn}/${local.prefix}outputs/*"]
  }

  # Listing only under outputs/. Without a broader s3:ListBucket, a read of a missing object
  # answers 403, not 404: a missing dataset reads as "access denied".
  statement {
    sid       = "ListOutputs"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.prefix}outputs/*"]
    }
  }

  statement {
    sid       = "ObjectsKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }

  # Images of the pool's ECR repositories, pulled with the instance role's token (the runner's
  # [ecr] registries).
  dynamic "statement" {
    for_each = length(var.ecr_repositories) > 0 ? [1] : []
    content {
      sid       = "EcrToken"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }

  dynamic "statement" {
    for_each = length(var.ecr_repositories) > 0 ? [1] : []
    content {
      sid       = "EcrPull"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
      resources = var.ecr_repositories
    }
  }

  statement {
    sid       = "SecretKey"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${var.region}.amazonaws.com", "ssm.${var.region}.amazonaws.com"]
    }
  }
}
