# What each service may do in AWS, and nothing else:
#   every service: read its own binary of the release, read the database secret, read its own
#               NATS seed (SSM Parameter Store, SecureString); log-ingest its Scylla password;
#   api:        read, write and delete kiln's blobs (code bundles, datasets, outputs);
#   item-batch: read and list kiln's blobs (AddItemsFromObjects: prefixes and manifests);
#   advisor:    read, write and list kiln's blobs, no delete (registering a sweep's best trial
#               as a model version lists and reads its outputs/ and saved artifacts/, and copies
#               them to artifacts/sha256/, a HEAD first: a missing blob must answer 404);
#   scheduler, log-ingest, predictor, provisioner: no S3 at all (the predictor reaches its
#               workers over NATS; the runners stage the workers' model versions);
#   provisioner: launch, tag and terminate the cluster's runner instances (provisioner-iam.tf),
#               which no other service may.
# Blobs are SSE-KMS: reading needs kms:Decrypt, writing kms:GenerateDataKey, both only through S3.
locals {
  blobs = "${var.bucket_arn}/${var.objects_prefix}/*"
  s3_access = {
    api = {
      object_actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
      kms_actions    = ["kms:Decrypt", "kms:GenerateDataKey"]
    }
    item-batch = {
      object_actions = ["s3:GetObject"]
      kms_actions    = ["kms:Decrypt"]
    }
    # CopyObject: s3:GetObject on the source, s3:PutObject on the copy; the SSE-KMS source is
    # decrypted and the copy encrypted with a new data key.
    advisor = {
      object_actions = ["s3:GetObject", "s3:PutObject"]
      kms_actions    = ["kms:Decrypt", "kms:GenerateDataKey"]
    }
  }
}

data "aws_iam_policy_document" "service" {
  for_each = local.services
  # The provisioner's EC2 statements join its own policy, and no other service's.
  source_policy_documents = each.key == "provisioner" ? [data.aws_iam_policy_document.provisioner.json] : []

  statement {
    sid       = "ReadRelease"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/${var.release_prefix}/${each.value.binary}"]
  }

  statement {
    sid       = "ReadDatabaseSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.database.secret_arn]
  }

  statement {
    sid       = "ReadNatsSeed"
    actions   = ["ssm:GetParameter"]
    resources = ["${var.nats_seed_arn_prefix}/${each.key}"]
  }

  dynamic "statement" {
    for_each = each.key == "log-ingest" ? [1] : []
    content {
      sid       = "ReadScyllaPassword"
      actions   = ["ssm:GetParameter"]
      resources = [var.scylla_password_parameter_arn]
    }
  }

  # The release objects, the secret and the NATS seed are encrypted with the kiln key.
  statement {
    sid       = "DecryptReleaseAndSecret"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com", "secretsmanager.${var.region}.amazonaws.com", "ssm.${var.region}.amazonaws.com"]
    }
  }

  dynamic "statement" {
    for_each = contains(keys(local.s3_access), each.key) ? [local.s3_access[each.key]] : []
    content {
      sid       = "Blobs"
      actions   = statement.value.object_actions
      resources = [local.blobs]
    }
  }

  # Listing the bucket without a prefix condition: a read of a missing blob then answers 404
  # (not 403), which kiln reports as "not found". It shows key names only, of a bucket that
  # holds nothing but kiln's blobs and releases.
  dynamic "statement" {
    for_each = contains(keys(local.s3_access), each.key) ? [1] : []
    content {
      sid       = "ListBlobs"
      actions   = ["s3:ListBucket"]
      resources = [var.bucket_arn]
    }
  }

  dynamic "statement" {
    for_each = contains(keys(local.s3_access), each.key) ? [local.s3_access[each.key]] : []
    content {
      sid       = "BlobsKey"
      actions   = statement.value.kms_actions
      resources = [var.kms_key_arn]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["s3.${var.region}.amazonaws.com"]
      }
    }
  }
}
